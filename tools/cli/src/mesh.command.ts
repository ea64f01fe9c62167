import {
  EnvoyApi,
  type EnvoyMode,
  envoyConfigFiles,
  envoySdsFiles,
  MeshPolicyError,
  parseMeshPolicy,
} from '@infermesh/mesh';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { parse as parseYaml } from 'yaml';
import { command, type GroupSpec } from './args';
import { CliError, EXIT, UsageError } from './cli-errors';
import type { CommandContext, CommandHandler } from './command-context';

/** The policy file: --policy, else the repository's envoy/mesh.yaml. */
function policyPath(ctx: CommandContext): string {
  return resolve(ctx.args.value('policy') ?? join(ctx.io.distDir, '..', 'envoy', 'mesh.yaml'));
}

function readPolicy(path: string) {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (error) {
    throw new CliError(
      `cannot read the mesh policy ${path}: ${error instanceof Error ? error.message : String(error)}`,
      EXIT.failed,
    );
  }
  try {
    return parseMeshPolicy(text, path);
  } catch (error) {
    if (error instanceof MeshPolicyError) throw new CliError(error.message, EXIT.failed);
    throw error;
  }
}

function modeOf(ctx: CommandContext): EnvoyMode {
  const mode = ctx.args.value('mode') ?? 'ads';
  if (mode !== 'ads' && mode !== 'static') throw new UsageError(`--mode must be ads or static, got "${mode}"`);
  return mode;
}

/**
 * `mesh envoy`: compiles the policy into each service's sidecar bootstrap and, with mTLS, the SDS
 * files they read their certificates through; checks each against Envoy's API, writes them.
 */
async function envoy(ctx: CommandContext): Promise<void> {
  const path = policyPath(ctx);
  const policy = readPolicy(path);
  const mode = modeOf(ctx);
  const out = resolve(ctx.args.value('out')!);
  const api = EnvoyApi.load();
  const files = envoyConfigFiles(policy, mode);
  const secrets = envoySdsFiles(policy);
  const problems = [
    ...files.flatMap((file) => api.checkBootstrap(file.bootstrap).map((p) => `${file.fileName}: ${p}`)),
    ...secrets.flatMap((file) =>
      api.check('envoy.service.discovery.v3.DiscoveryResponse', file.response).map((p) => `${file.fileName}: ${p}`),
    ),
  ];
  if (problems.length > 0)
    throw new CliError(
      `the generated configuration fails Envoy's API check:\n${problems.map((p) => `  - ${p}`).join('\n')}`,
      EXIT.failed,
    );
  mkdirSync(out, { recursive: true });
  for (const file of [...files, ...secrets]) writeFileSync(join(out, file.fileName), file.text);
  ctx.io.stdout.write(`${[...files, ...secrets].map((file) => join(out, file.fileName)).join('\n')}\n`);
  const sds =
    secrets.length === 0
      ? ''
      : ` and ${secrets.length} SDS files (${secrets.map((file) => file.fileName).join(', ')}, for ${policy.sidecar.configDir})`;
  ctx.note(
    `wrote ${files.length} Envoy configurations (${mode})${sds} from ${path}; each passed the check against Envoy's v3 API\n`,
  );
}

/** `mesh check`: the strict check of Envoy bootstrap files (and SDS files), each problem with its path. */
async function check(ctx: CommandContext): Promise<void> {
  const api = EnvoyApi.load();
  let failed = 0;
  for (const file of ctx.args.positionals) {
    let document: unknown;
    try {
      document = parseYaml(readFileSync(file, 'utf8'));
    } catch (error) {
      ctx.io.stdout.write(
        `${file}: cannot be read as YAML: ${error instanceof Error ? error.message : String(error)}\n`,
      );
      failed += 1;
      continue;
    }
    // A file-based SDS file (a DiscoveryResponse: `resources`, no bootstrap field) is checked as one.
    const sds =
      typeof document === 'object' &&
      document !== null &&
      'resources' in document &&
      !('static_resources' in document) &&
      !('node' in document);
    const problems = sds
      ? api.check('envoy.service.discovery.v3.DiscoveryResponse', document)
      : api.checkBootstrap(document);
    if (problems.length > 0) failed += 1;
    ctx.io.stdout.write(problems.length === 0 ? `${file}: ok\n` : problems.map((p) => `${file}: ${p}\n`).join(''));
  }
  if (failed > 0)
    throw new CliError(`${failed} of ${ctx.args.positionals.length} files fail Envoy's API check`, EXIT.failed);
}

/** `mesh policy`: validates the policy and prints each edge with its settings resolved. */
async function policyCommand(ctx: CommandContext): Promise<void> {
  const policy = readPolicy(policyPath(ctx));
  ctx.io.stdout.write(`${JSON.stringify(policy.edges, null, 2)}\n`);
}

const POLICY_FLAG = {
  name: 'policy',
  kind: 'value',
  placeholder: '<mesh.yaml>',
  description: 'The mesh policy (default: envoy/mesh.yaml of this repository)',
} as const;

/** `infermesh mesh ...`: the mesh policy and the Envoy sidecar configurations compiled from it. */
export const MESH_GROUP: GroupSpec<CommandHandler> = {
  kind: 'group',
  name: 'mesh',
  summary: 'The mesh policy (envoy/mesh.yaml) and the Envoy sidecar configurations compiled from it',
  flags: [],
  commands: [
    command<CommandHandler>({
      name: 'envoy',
      summary:
        "Write each service's Envoy sidecar bootstrap (<service>.yaml) compiled from the policy, checked against Envoy's v3 API",
      details: [
        '--mode ads (default): the sidecar takes listeners and clusters from the registry over ADS; its bootstrap',
        'holds the inbound listener, the stats listener, its local service and the control plane.',
        "--mode static: everything compiled in, upstreams found by their Kubernetes Services' DNS names.",
        'With mtls (the default), also sds-identity.yaml and sds-trust-bundle.yaml: the file-based SDS secrets every',
        "sidecar reads from the policy's sidecar.configDir (mount them with the bootstraps).",
      ].join('\n'),
      positionals: [],
      flags: [
        { name: 'out', kind: 'value', placeholder: '<dir>', required: true, description: 'Where to write the files' },
        { name: 'mode', kind: 'value', placeholder: 'ads|static', description: 'ads (default) or static' },
        POLICY_FLAG,
      ],
      handler: envoy,
    }),
    command<CommandHandler>({
      name: 'check',
      summary:
        "Check Envoy bootstrap (or SDS) files strictly against Envoy's v3 API: fields, types, enums, validation rules, references",
      positionals: [{ name: '<file.yaml...>', variadic: true }],
      flags: [],
      handler: check,
    }),
    command<CommandHandler>({
      name: 'policy',
      summary: 'Validate the mesh policy and print every edge with its settings resolved (JSON)',
      positionals: [],
      flags: [POLICY_FLAG],
      handler: policyCommand,
    }),
  ],
};
