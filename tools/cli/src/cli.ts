import { status } from '@grpc/grpc-js';
import { ConfigError } from '@infermesh/config';
import { RpcError } from '@infermesh/grpc';
import { existsSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { buildProgram, command, type GroupSpec, type Invocation, parseCommandLine, renderHelp } from './args';
import { loadCliConfig } from './cli.config';
import { CliError, EXIT, UsageError } from './cli-errors';
import type { CliIo } from './cli-io';
import { CommandContext, type CommandHandler } from './command-context';
import { completionScript, isShell, SHELLS } from './completion';
import { K8S_GROUP } from './k8s.command';
import { KEYS_GROUP } from './keys.command';
import { MESH_GROUP } from './mesh.command';
import { MODELS_GROUP } from './models.command';
import { ROLLOUT_GROUP } from './rollout.command';
import { up, upOptions } from './up.command';

const ROOT_DETAILS = `Environment (models, rollout, keys):
  INFERMESH_GATEWAY           The gateway's gRPC address (default 127.0.0.1:8001); --gateway wins
  INFERMESH_API_KEY           An admin API key of the gateway; --api-key wins

Environment (up):
  INFERMESH_API_KEY           API key clients must send (generated and printed when unset)
  REDIS_URL                   Use Redis for the registry, the result cache, and the gateway's API keys and
                              rate limits (embedded stores otherwise)
  INFERMESH_DATA_DIR          Where embedded stores and artifacts live (default .infermesh)
  INFERMESH_HOST              Address the services listen on (default 127.0.0.1)
  INFERMESH_DEMO_MODELS       Demo models to register (default mlp,tiny,multi-io,classifier)
  INFERMESH_LOG_LEVEL         debug | info | warn | error (default info)
  INFERMESH_READY_TIMEOUT_MS  How long to wait for the system to be ready (default 120000)

Exit status: 0 done; 1 the operation failed (the gateway refused it, a version FAILED, a wait timed
out, an automatic rollout followed with --wait was rolled back or aborted); 2 usage error (unknown
command or flag, bad value, no API key); 3 the gateway cannot be reached.`;

/** Every command of `infermesh`. */
export const COMMANDS: GroupSpec<CommandHandler> = {
  kind: 'group',
  name: 'infermesh',
  summary: 'infermesh: online ONNX model inference serving (KServe v2 / Open Inference Protocol).',
  details: ROOT_DETAILS,
  flags: [],
  commands: [
    command<CommandHandler>({
      name: 'up',
      summary: 'Start the six services on this machine with the demo models (what `npm start` runs)',
      details: [
        'A service that exits unexpectedly is started again after 0.5 s, 1 s, 2 s… (at most 30 s), and left',
        'stopped after 5 exits in a row within 30 s of starting; each time the reason is logged.',
        '`npm start -- --replicas worker=2` passes the flag on.',
      ].join('\n'),
      positionals: [],
      flags: [
        {
          name: 'replicas',
          kind: 'value',
          placeholder: '<service=n,...>',
          description:
            'Instances of a service, each on its own ports: worker=2; router, batcher and cache too in the mesh (INFERMESH_MESH=xds, the default) (1 to 8 each)',
        },
      ],
      handler: async (ctx) => {
        const config = loadCliConfig(ctx.io.env);
        return up(config, ctx.io.distDir, upOptions(ctx.args.value('replicas'), config.mesh));
      },
    }),
    MODELS_GROUP,
    ROLLOUT_GROUP,
    KEYS_GROUP,
    MESH_GROUP,
    K8S_GROUP,
    command<CommandHandler>({
      name: 'completion',
      summary: 'Print the shell completion script of infermesh: `source <(infermesh completion bash)`',
      details: [
        "Completes commands and flags. Load it in the shell's start-up file: for bash,",
        '`source <(infermesh completion bash)` in ~/.bashrc; for zsh, `source <(infermesh completion zsh)` in',
        '~/.zshrc after compinit, or save it as _infermesh in a directory of $fpath.',
      ].join('\n'),
      positionals: [{ name: `<${SHELLS.join('|')}>` }],
      flags: [],
      handler: async (ctx) => {
        const shell = ctx.args.positionals[0]!;
        if (!isShell(shell)) throw new UsageError(`the shell must be ${SHELLS.join(' or ')}, got "${shell}"`);
        ctx.io.stdout.write(completionScript(shell, buildProgram(COMMANDS, { version: cliVersion() }).root));
      },
    }),
    command<CommandHandler>({
      name: 'help',
      summary: "Show this help, or a command's: `infermesh help models register`",
      positionals: [{ name: '[command...]', optional: true, variadic: true }],
      flags: [],
      // Handled before parsing: `help <words>` is `<words> --help`.
      handler: async () => undefined,
    }),
  ],
};

/**
 * Runs `infermesh` with its arguments and returns the exit status: 0 done, 1 the operation failed,
 * 2 usage error, 3 the gateway cannot be reached. Results go to stdout; progress, notes and errors
 * (`infermesh: <message>`) to stderr.
 */
export async function runCli(argv: readonly string[], io: CliIo): Promise<number> {
  const version = cliVersion();
  if (argv.length === 0) {
    io.stdout.write(renderHelp(COMMANDS, [], { version }));
    return EXIT.ok;
  }
  const words = argv[0] === 'help' ? [...argv.slice(1), '--help'] : argv;
  let invocation: Invocation<CommandHandler>;
  try {
    invocation = parseCommandLine(words, COMMANDS, { version });
  } catch (error) {
    if (error instanceof UsageError) return usageFailure(io, error, error.path ?? []);
    throw error;
  }
  if (invocation.version !== undefined) {
    io.stdout.write(`${invocation.version}\n`);
    return EXIT.ok;
  }
  if (invocation.help) {
    io.stdout.write(renderHelp(COMMANDS, invocation.path, { version }));
    return EXIT.ok;
  }
  const node = invocation.nodes[invocation.nodes.length - 1]!;
  if (node.kind !== 'command') return usageFailure(io, new UsageError('missing command'), invocation.path);
  const context = new CommandContext(io, invocation.args);
  try {
    await node.handler(context);
    return EXIT.ok;
  } catch (error) {
    if (error instanceof UsageError) return usageFailure(io, error, error.path ?? invocation.path);
    return reportFailure(io, error, context);
  } finally {
    context.close();
  }
}

function usageFailure(io: CliIo, error: UsageError, path: readonly string[]): number {
  io.stderr.write(`infermesh: ${error.message}\n\n${renderHelp(COMMANDS, path, { version: cliVersion() })}`);
  return EXIT.usage;
}

let cachedVersion: string | undefined;

/** The version of infermesh: that of the repository's package.json, found up from this file (src or dist). */
function cliVersion(): string {
  if (cachedVersion === undefined) {
    cachedVersion = 'unknown';
    for (let dir = __dirname; dirname(dir) !== dir; dir = dirname(dir)) {
      const file = join(dir, 'package.json');
      if (!existsSync(file)) continue;
      const pkg = JSON.parse(readFileSync(file, 'utf8')) as { name?: unknown; version?: unknown };
      if (pkg.name === 'infermesh' && typeof pkg.version === 'string') {
        cachedVersion = pkg.version;
        break;
      }
    }
  }
  return cachedVersion;
}

/** Prints why a command failed and returns its exit status. */
function reportFailure(io: CliIo, error: unknown, context: CommandContext): number {
  if (error instanceof CliError) {
    io.stderr.write(`infermesh: ${error.message}\n`);
    return error.exitCode;
  }
  if (error instanceof ConfigError) {
    io.stderr.write(`infermesh: ${error.message}\n`);
    return EXIT.usage;
  }
  if (error instanceof RpcError) {
    const code = status[error.code] ?? String(error.code);
    if (error.code === status.UNAVAILABLE) {
      const gateway = context.gatewayAddress ?? 'the gateway';
      const transport = error.reason === undefined;
      io.stderr.write(
        transport
          ? `infermesh: cannot reach the gateway at ${gateway} (${code}: ${error.message.replace(/\.? *Resolution note: *$/, '')}).\n` +
              'Is infermesh running? Start it with `infermesh up`, or point --gateway (INFERMESH_GATEWAY) at its gRPC port.\n'
          : `infermesh: ${error.message} (${code}); the gateway at ${gateway} cannot reach the registry: is it running?\n`,
      );
      return EXIT.unreachable;
    }
    const hint =
      error.code === status.UNAUTHENTICATED
        ? '\nCheck the API key (--api-key or INFERMESH_API_KEY).'
        : error.code === status.PERMISSION_DENIED
          ? '\nThe admin API needs a key with the admin scope.'
          : '';
    io.stderr.write(`infermesh: ${error.message} (${code})${hint}\n`);
    return EXIT.failed;
  }
  io.stderr.write(`infermesh: ${error instanceof Error ? error.message : String(error)}\n`);
  return EXIT.failed;
}
