import { readFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { runCli } from './cli';
import { runCapturing } from './testing/cli-runner';
import { type FakeGateway, startFakeGateway } from './testing/fake-gateway';

const API_KEY = 'admin-key-0123456789abcdef';

/** A loopback port nothing listens on: taken from the system, then released. */
async function closedPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const address = server.address();
  await new Promise((resolve) => server.close(resolve));
  return typeof address === 'object' && address !== null ? address.port : 0;
}

describe(runCli.name, () => {
  describe('help and usage errors', () => {
    it('prints the commands, the environment and the exit statuses with no arguments, --help or help', async () => {
      const bare = await runCapturing([], {});
      const flag = await runCapturing(['--help'], {});
      const word = await runCapturing(['help'], {});

      expect(bare).toMatchObject({ code: 0, stderr: '' });
      for (const expected of [
        'Usage: infermesh <command> [flags]',
        '  up ',
        '  models ',
        '  rollout ',
        '  keys ',
        'INFERMESH_GATEWAY',
        'REDIS_URL',
        'Exit status: 0 done',
      ]) {
        expect(bare.stdout).toContain(expected);
      }
      expect(flag).toEqual(bare);
      expect(word).toEqual(bare);
    });

    it('prints the subcommands of a group with --help', async () => {
      const run = await runCapturing(['rollout', '-h'], {});

      expect(run.code).toBe(0);
      expect(run.stdout).toMatch(/^Usage: infermesh rollout <command> \[flags\]\n/);
      for (const name of ['show', 'canary', 'ab', 'shadow', 'fallback', 'weights', 'promote', 'rollback']) {
        expect(run.stdout).toMatch(new RegExp(`\\n  ${name} +\\S`));
      }
      expect(run.stdout).toContain('--gateway <host:port>');
    });

    it("prints a command's flags with --help, even without its arguments, and `help <command>` does the same", async () => {
      const run = await runCapturing(['models', 'register', '--help'], {});
      const viaHelp = await runCapturing(['help', 'models', 'register'], {});

      expect(run.code).toBe(0);
      expect(run.stdout).toMatch(/^Usage: infermesh models register <file.onnx> --name <name> \[flags\]\n/);
      for (const flag of [
        '--name <name>',
        '--version <id>',
        '--max-batch-size <n>',
        '--pin',
        '--label <key=value>',
        '(repeatable)',
        '--timeout <s>',
        '--gateway <host:port>',
        '--api-key <key>',
        '--json',
        '-h, --help',
      ]) {
        expect(run.stdout).toContain(flag);
      }
      expect(viaHelp).toEqual(run);
    });

    it('refuses an unknown command with the usage on stderr and exit 2', async () => {
      const run = await runCapturing(['deploy'], {});

      expect(run.code).toBe(2);
      expect(run.stdout).toBe('');
      expect(run.stderr).toMatch(
        /^infermesh: unknown command "deploy"; the commands are up, models, rollout, keys, mesh, k8s, completion, help\n\nUsage: infermesh <command> \[flags\]\n/,
      );
    });

    it('refuses an unknown flag with the usage of the command on stderr and exit 2', async () => {
      const run = await runCapturing(['models', 'list', '--verbose'], {});

      expect(run.code).toBe(2);
      expect(run.stderr).toMatch(
        /^infermesh: unknown flag --verbose for "infermesh models list"\n\nUsage: infermesh models list \[flags\]\n/,
      );
    });

    it('prints the version of package.json with --version or -V', async () => {
      const { version } = JSON.parse(readFileSync(join(__dirname, '..', '..', '..', 'package.json'), 'utf8')) as {
        version: string;
      };

      expect(await runCapturing(['--version'], {})).toEqual({ code: 0, stdout: `${version}\n`, stderr: '' });
      expect(await runCapturing(['-V'], {})).toEqual({ code: 0, stdout: `${version}\n`, stderr: '' });
      expect((await runCapturing(['--help'], {})).stdout).toContain('-V, --version');
    });

    it('suggests the command or flag meant by a mistyped one', async () => {
      const group = await runCapturing(['modles', 'list'], {});
      const sub = await runCapturing(['rollout', 'promot', 'mlp'], {});
      const flag = await runCapturing(['models', 'list', '--jsn'], {});

      expect(group.code).toBe(2);
      expect(group.stderr).toMatch(
        /^infermesh: unknown command "modles"; the commands are [^\n]+\n\(Did you mean models\?\)\n\nUsage: infermesh <command> \[flags\]\n/,
      );
      expect(sub.stderr).toMatch(
        /^infermesh: unknown command "promot" of "rollout"; the commands are [^\n]+\n\(Did you mean promote\?\)\n\nUsage: infermesh rollout <command>/,
      );
      expect(flag).toMatchObject({ code: 2, stdout: '' });
      expect(flag.stderr).toMatch(
        /^infermesh: unknown flag --jsn for "infermesh models list"\n\(Did you mean --json\?\)\n\nUsage: infermesh models list \[flags\]\n/,
      );
    });

    it('refuses a group without a command', async () => {
      const run = await runCapturing(['models'], {});

      expect(run.code).toBe(2);
      expect(run.stderr).toMatch(
        /^infermesh: missing command after "models"\n\nUsage: infermesh models <command> \[flags\]\n/,
      );
    });
  });

  describe('reaching the gateway', () => {
    let running: FakeGateway;

    beforeEach(async () => {
      running = await startFakeGateway(API_KEY);
    });

    afterEach(async () => {
      await running.stop();
    });

    it('exits 2 with a clear message when no API key is given', async () => {
      const run = await runCapturing(['models', 'list'], { INFERMESH_GATEWAY: running.address });

      expect(run).toEqual({
        code: 2,
        stdout: '',
        stderr:
          'infermesh: no API key: pass --api-key <key> or set INFERMESH_API_KEY (an admin key of the gateway; `infermesh up` prints the one it uses)\n',
      });
      expect(running.registry.calls).toEqual([]);
    });

    it('uses --gateway and --api-key over the environment', async () => {
      const port = await closedPort();

      const run = await runCapturing(['models', 'list', '--gateway', running.address, '--api-key', API_KEY], {
        INFERMESH_GATEWAY: `127.0.0.1:${port}`,
        INFERMESH_API_KEY: 'another-key-that-is-wrong',
      });

      expect(run).toEqual({ code: 0, stdout: 'No models registered.\n', stderr: '' });
      expect(running.registry.calls).toMatchObject([{ method: 'listModels', authorization: `Bearer ${API_KEY}` }]);
    });

    it('exits 1 with the code name and a hint when the gateway refuses the key', async () => {
      const run = await runCapturing(['models', 'list'], {
        INFERMESH_GATEWAY: running.address,
        INFERMESH_API_KEY: 'a-wrong-key',
      });

      expect(run).toEqual({
        code: 1,
        stdout: '',
        stderr: 'infermesh: invalid API key (UNAUTHENTICATED)\nCheck the API key (--api-key or INFERMESH_API_KEY).\n',
      });
    });

    it('exits 2 for a malformed gateway address', async () => {
      const fromFlag = await runCapturing(['models', 'list', '--gateway', 'localhost'], { INFERMESH_API_KEY: API_KEY });
      const fromEnv = await runCapturing(['models', 'list'], {
        INFERMESH_GATEWAY: 'localhost',
        INFERMESH_API_KEY: API_KEY,
      });

      expect(fromFlag).toEqual({
        code: 2,
        stdout: '',
        stderr: 'infermesh: invalid configuration:\n  - --gateway: expected host:port (got "localhost")\n',
      });
      expect(fromEnv).toEqual({
        code: 2,
        stdout: '',
        stderr: 'infermesh: invalid configuration:\n  - INFERMESH_GATEWAY: expected host:port (got "localhost")\n',
      });
    });
  });

  it('exits 3 with a hint to run `infermesh up` when nothing listens at the gateway address', async () => {
    const port = await closedPort();

    const run = await runCapturing(['rollout', 'show', 'mlp'], {
      INFERMESH_GATEWAY: `127.0.0.1:${port}`,
      INFERMESH_API_KEY: API_KEY,
    });

    expect(run.code).toBe(3);
    expect(run.stdout).toBe('');
    expect(run.stderr).toMatch(
      new RegExp(`^infermesh: cannot reach the gateway at 127\\.0\\.0\\.1:${port} \\(UNAVAILABLE: .+\\)\\.\\n`),
    );
    expect(run.stderr).toContain('Start it with `infermesh up`');
  });
});
