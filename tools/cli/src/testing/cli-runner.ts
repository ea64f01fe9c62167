import type { Env } from '@infermesh/config';
import { runCli } from '../cli';

export interface CliRun {
  code: number;
  stdout: string;
  stderr: string;
}

/** Runs `infermesh` in-process with `env`, capturing what it writes; `tty` makes stderr a terminal. */
export async function runCapturing(
  argv: readonly string[],
  env: Env,
  options: { tty?: boolean } = {},
): Promise<CliRun> {
  let stdout = '';
  let stderr = '';
  const code = await runCli(argv, {
    env,
    stdout: { write: (text: string) => (stdout += text), isTTY: options.tty === true },
    stderr: { write: (text: string) => (stderr += text), isTTY: options.tty === true },
    distDir: '/nonexistent/dist',
  });
  return { code, stdout, stderr };
}
