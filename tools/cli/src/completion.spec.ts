import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { completionScript } from './completion';
import { runCapturing } from './testing/cli-runner';

/** What bash offers for the words typed so far, the last being the word completed. */
function bashCompletes(script: string, typed: readonly string[]): string[] {
  const dir = mkdtempSync(join(tmpdir(), 'infermesh-completion-'));
  try {
    const file = join(dir, 'infermesh.bash');
    writeFileSync(file, script);
    const words = typed.map((w) => `'${w}'`).join(' ');
    const out = execFileSync(
      'bash',
      [
        '-c',
        `source ${file}; COMP_WORDS=(${words}); COMP_CWORD=${typed.length - 1}; _infermesh; printf '%s\\n' "\${COMPREPLY[@]}"`,
      ],
      { encoding: 'utf8' },
    );
    return out.split('\n').filter((line) => line !== '');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

describe(completionScript.name, () => {
  it('completes the commands, subcommands and flags of the command tree in bash', async () => {
    const run = await runCapturing(['completion', 'bash'], {});

    expect(run).toMatchObject({ code: 0, stderr: '' });
    expect(run.stdout).toContain('complete -o default -F _infermesh infermesh');
    expect(bashCompletes(run.stdout, ['infermesh', ''])).toEqual(
      expect.arrayContaining([
        'up',
        'models',
        'rollout',
        'keys',
        'mesh',
        'k8s',
        'completion',
        'help',
        '--version',
        '--help',
      ]),
    );
    expect(bashCompletes(run.stdout, ['infermesh', 'mo'])).toEqual(['models']);
    expect(bashCompletes(run.stdout, ['infermesh', 'models', 're'])).toEqual(['register', 'retire']);
    expect(bashCompletes(run.stdout, ['infermesh', 'models', 'register', 'm.onnx', '--ma'])).toEqual([
      '--max-batch-size',
    ]);
    // A group's flags complete under its commands; the program's --version does not.
    expect(bashCompletes(run.stdout, ['infermesh', 'models', 'list', '--'])).toEqual([
      '--gateway',
      '--api-key',
      '--json',
      '--help',
    ]);
    expect(bashCompletes(run.stdout, ['infermesh', 'rollout', 'canary', 'mlp', '--ver'])).toEqual(['--version']);
  });

  it('writes a zsh completion function with the same commands and flags', async () => {
    const run = await runCapturing(['completion', 'zsh'], {});

    expect(run).toMatchObject({ code: 0, stderr: '' });
    expect(run.stdout).toMatch(/^#compdef infermesh\n/);
    expect(run.stdout).toContain(
      "('models register') candidates=('--name' '--version' '--max-batch-size' '--pin' '--label' '--warmup' '--intra-op-threads' '--timeout' '--gateway' '--api-key' '--json' '--help'); leaf=1 ;;",
    );
    expect(run.stdout).toContain('compdef _infermesh infermesh');
  });

  it('refuses a shell it has no script for, with exit 2', async () => {
    const run = await runCapturing(['completion', 'fish'], {});

    expect(run.code).toBe(2);
    expect(run.stderr).toMatch(
      /^infermesh: the shell must be bash or zsh, got "fish"\n\nUsage: infermesh completion <bash\|zsh> \[flags\]\n/,
    );
  });
});
