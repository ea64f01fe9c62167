import type { Clock } from '@infermesh/clock';
import type { Env } from '@infermesh/config';
import { runCli } from '../cli';

export interface CliRun {
  code: number;
  stdout: string;
  stderr: string;
}

export interface CaptureOptions {
  /** Makes stderr a terminal. */
  tty?: boolean;
  /** The CLI's time (a ManualClock, say); systemClock by default. */
  clock?: Clock;
  /** Hears each text written to stderr as it is written, before the run ends. */
  onStderr?: (text: string) => void;
}

/** Runs `infermesh` in-process with `env`, capturing what it writes. */
export async function runCapturing(argv: readonly string[], env: Env, options: CaptureOptions = {}): Promise<CliRun> {
  let stdout = '';
  let stderr = '';
  const code = await runCli(argv, {
    env,
    stdout: { write: (text: string) => (stdout += text), isTTY: options.tty === true },
    stderr: {
      write: (text: string) => {
        stderr += text;
        options.onStderr?.(text);
      },
      isTTY: options.tty === true,
    },
    distDir: '/nonexistent/dist',
    ...(options.clock !== undefined && { clock: options.clock }),
  });
  return { code, stdout, stderr };
}
