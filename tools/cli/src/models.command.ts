import type { MessageInitShape } from '@bufbuild/protobuf';
import {
  DeleteModelResponseSchema,
  ListModelsResponseSchema,
  type Model,
  ModelSchema,
  ModelVersionSchema,
  type VersionPolicySchema,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { modelIdOf, versionIdOf } from '@infermesh/rollout';
import { command, type GroupSpec, parseInteger, parseKeyValue, parseSeconds, parseVersionId } from './args';
import { UsageError } from './cli-errors';
import type { CommandContext, CommandHandler } from './command-context';
import { GATEWAY_FLAGS } from './gateway-flags';
import { DEFAULT_QUANTIZE_TIMEOUT_S, quantize } from './model-quantize';
import { executionOf, INTRA_OP_THREADS_FLAG, registerModel } from './model-register';
import { formatModelDetails, formatModelList, formatVersionPolicy, stateName } from './output/format';

const DEFAULT_REGISTER_TIMEOUT_S = 300;

const NAME = { name: '<name>' };

async function register(ctx: CommandContext): Promise<void> {
  const { args } = ctx;
  const version = args.value('version');
  const maxBatchSize = args.value('max-batch-size');
  const labels: Record<string, string> = {};
  for (const label of args.list('label')) {
    const [key, value] = parseKeyValue(label, '--label');
    labels[key] = value;
  }
  await registerModel(ctx, {
    file: args.positionals[0]!,
    model: args.required('name'),
    versionId: version === undefined ? undefined : parseVersionId(version, '--version'),
    maxBatchSize: maxBatchSize === undefined ? undefined : parseInteger(maxBatchSize, '--max-batch-size', 0),
    pin: args.switch('pin'),
    labels,
    timeoutMs: parseSeconds(args.value('timeout') ?? String(DEFAULT_REGISTER_TIMEOUT_S), '--timeout') * 1000,
    warmUpFile: args.value('warmup'),
    execution: executionOf(args),
  });
}

async function list(ctx: CommandContext): Promise<void> {
  const session = ctx.gateway();
  const response = await session.registry.listModels({}, session.call());
  ctx.result(ListModelsResponseSchema, response, () => formatModelList(response.models));
}

/** The model `name` (GetModel). */
export async function getModel(ctx: CommandContext, name: string): Promise<Model> {
  const session = ctx.gateway();
  const { model } = await session.registry.getModel({ name: `models/${name}` }, session.call());
  if (model === undefined) throw new Error(`the gateway returned no model for "${name}"`);
  return model;
}

async function show(ctx: CommandContext): Promise<void> {
  const model = await getModel(ctx, ctx.args.positionals[0]!);
  ctx.result(ModelSchema, model, () => formatModelDetails(model));
}

async function setUnloaded(ctx: CommandContext, unloaded: boolean): Promise<void> {
  const name = ctx.args.positionals[0]!;
  const session = ctx.gateway();
  const { model } = await session.registry.updateModel(
    { model: { name: `models/${name}`, unloaded }, updateMask: { paths: ['unloaded'] } },
    session.call(),
  );
  if (model === undefined) throw new Error(`the gateway returned no model for "${name}"`);
  ctx.result(ModelSchema, model, () =>
    unloaded
      ? `${name} is unloaded: its versions drain and stop serving; \`infermesh models load ${name}\` loads it again.\n`
      : `${name} loads the versions its policy selects (${formatVersionPolicy(model.versionPolicy)}); follow them with \`infermesh models show ${name}\`.\n`,
  );
}

async function retire(ctx: CommandContext): Promise<void> {
  const name = ctx.args.positionals[0]!;
  const versionId = parseVersionId(ctx.args.required('version'), '--version');
  const session = ctx.gateway();
  const { version } = await session.registry.retireModelVersion(
    { name: `models/${name}/versions/${versionId}` },
    session.call(),
  );
  if (version === undefined) throw new Error(`the gateway returned no version for ${name} version ${versionId}`);
  ctx.result(
    ModelVersionSchema,
    version,
    () => `${name} version ${versionIdOf(version.name)}: ${stateName(version.state)}\n`,
  );
}

async function remove(ctx: CommandContext): Promise<void> {
  const name = ctx.args.positionals[0]!;
  const session = ctx.gateway();
  const response = await session.registry.deleteModel({ name: `models/${name}` }, session.call());
  ctx.result(DeleteModelResponseSchema, response, () => `Deleted model ${name} and its versions.\n`);
}

/** The version policy that --latest, --specific or --all (exactly one) asks for. */
export function versionPolicyOf(ctx: CommandContext): MessageInitShape<typeof VersionPolicySchema> {
  const { args } = ctx;
  const given = ['latest', 'specific', 'all'].filter((f) => args.has(f));
  if (given.length !== 1) {
    throw new UsageError(
      given.length === 0
        ? 'give one of --latest <n>, --specific <ids> or --all'
        : `give only one of ${given.map((f) => `--${f}`).join(', ')}`,
    );
  }
  const latest = args.value('latest');
  if (latest !== undefined) return { policy: { case: 'latest', value: parseInteger(latest, '--latest', 1) } };
  const specific = args.value('specific');
  if (specific !== undefined) {
    const versions = specific.split(',').map((v) => v.trim());
    return { policy: { case: 'specific', value: { versions: versions.map((v) => parseVersionId(v, '--specific')) } } };
  }
  return { policy: { case: 'all', value: {} } };
}

async function setPolicy(ctx: CommandContext): Promise<void> {
  const name = ctx.args.positionals[0]!;
  const versionPolicy = versionPolicyOf(ctx);
  const session = ctx.gateway();
  const { model } = await session.registry.updateModel(
    { model: { name: `models/${name}`, versionPolicy }, updateMask: { paths: ['version_policy'] } },
    session.call(),
  );
  if (model === undefined) throw new Error(`the gateway returned no model for "${name}"`);
  ctx.result(
    ModelSchema,
    model,
    () => `${modelIdOf(model.name)}: version policy ${formatVersionPolicy(model.versionPolicy)}\n`,
  );
}

/** `infermesh models ...`: the model repository, through the gateway's admin API. */
export const MODELS_GROUP: GroupSpec<CommandHandler> = {
  kind: 'group',
  name: 'models',
  summary: 'Register, list, inspect, load, unload, retire and delete models',
  flags: GATEWAY_FLAGS,
  commands: [
    command<CommandHandler>({
      name: 'register',
      summary: 'Upload an ONNX file as a new version of a model and wait until it is READY',
      details: [
        'Streams the file to the registry in 1 MiB chunks (the registry checks its SHA-256), registers',
        'it as a version, and follows its state (REGISTERED -> LOADING -> READY). Exits 0 once the',
        'version is READY, 1 when it FAILED (the reason is printed) or the wait timed out.',
        '',
        'With --warmup, workers run the samples of the file before the version serves, and a sample the',
        "model fails makes it FAILED with the model's message. The file is one sample",
        '  {"inputs":[{"name":"audio","datatype":"FP32","shape":[1,512],"data":[0.1,...]},',
        '             {"name":"sr","datatype":"INT64","shape":[1],"data":[16000]}]}',
        'or several, {"samples":[{"name":"16 kHz","inputs":[...]},...]}; an input may give',
        '"zero_data": true or "random_data": true instead of "data". Without --warmup, workers run',
        'synthetic inputs (zeros, each dynamic dimension 1): a model they do not suit is READY but not',
        'warmed up, and a warning says why.',
      ].join('\n'),
      positionals: [{ name: '<file.onnx>' }],
      flags: [
        {
          name: 'name',
          kind: 'value',
          placeholder: '<name>',
          required: true,
          description: 'The model the version belongs to (created when new)',
        },
        {
          name: 'version',
          kind: 'value',
          placeholder: '<id>',
          description: "The version id (default: one more than the model's highest, 1 for a new model)",
        },
        {
          name: 'max-batch-size',
          kind: 'value',
          placeholder: '<n>',
          description: 'Overrides the max batch size read from the model',
        },
        {
          name: 'pin',
          kind: 'switch',
          description: 'Pin the model: workers load it ahead of requests and never evict it',
        },
        { name: 'label', kind: 'list', placeholder: '<key=value>', description: 'Add a label to the model' },
        {
          name: 'warmup',
          kind: 'value',
          placeholder: '<file.json>',
          description:
            'Warm-up samples the workers run before the version serves: JSON of named tensors as in a KServe v2 request',
        },
        INTRA_OP_THREADS_FLAG,
        {
          name: 'timeout',
          kind: 'value',
          placeholder: '<s>',
          description: `How long to wait for READY, in seconds (default ${DEFAULT_REGISTER_TIMEOUT_S})`,
        },
      ],
      handler: register,
    }),
    command<CommandHandler>({
      name: 'quantize',
      summary: 'Derive an int8 variant of a version, checked against it on calibration inputs, and register it',
      details: [
        'The registry quantizes the version dynamically (the constant weights of its MatMul and Gemm nodes,',
        'and with --conv of its Conv nodes, to int8 with a scale per output channel, in 7 bits unless',
        '--full-range: x86 CPUs without VNNI overflow 8-bit weights; activations are quantized at run',
        'time), runs the variant beside its source on the calibration inputs, and',
        'registers it only when its relative L2 error is within --max-rel-l2. It registers it as the next',
        'version of the same model, or with --as under another model (say, to be the fallback of the first).',
        'The variant records its lineage (source, SHA-256, method, settings, nodes left in float and why)',
        'and its figures (max abs diff, relative L2, top-1 agreement): `infermesh models show`. The',
        'command then follows the variant until a worker has loaded it (READY), like `models register`.',
        '',
        'The calibration file has the form of a --warmup file of `models register`; without one, the',
        'registry runs 4 samples of random inputs from the signature. Exits 1 with the figures when the',
        'variant is refused.',
      ].join('\n'),
      positionals: [NAME],
      flags: [
        {
          name: 'version',
          kind: 'value',
          placeholder: '<id>',
          description: 'The version to quantize (default: the stable version, else the latest READY one)',
        },
        {
          name: 'as',
          kind: 'value',
          placeholder: '<name>',
          description:
            'Register the variant under this model (created when new) rather than as a new version of <name>',
        },
        {
          name: 'new-version',
          kind: 'value',
          placeholder: '<id>',
          description: "The variant's version id (default: one more than the target model's highest)",
        },
        {
          name: 'calibration',
          kind: 'value',
          placeholder: '<file.json>',
          description: 'Samples both run on for the accuracy gate, as a --warmup file',
        },
        {
          name: 'max-rel-l2',
          kind: 'value',
          placeholder: '<x>',
          description: 'Refuse a variant whose relative L2 error is above this (default 0.02)',
        },
        { name: 'per-tensor', kind: 'switch', description: 'One scale per weight rather than per output channel' },
        {
          name: 'conv',
          kind: 'switch',
          description: 'Quantize Conv weights too: smaller, but slower than float on CPU',
        },
        {
          name: 'full-range',
          kind: 'switch',
          description: 'Weights in 8 bits, not 7: only for workers whose CPUs all have VNNI',
        },
        {
          ...INTRA_OP_THREADS_FLAG,
          description: "Operator threads of each instance of the variant (default: its source's)",
        },
        {
          name: 'timeout',
          kind: 'value',
          placeholder: '<s>',
          description: `How long to wait for the derivation and READY, in seconds (default ${DEFAULT_QUANTIZE_TIMEOUT_S})`,
        },
      ],
      handler: quantize,
    }),
    command<CommandHandler>({
      name: 'list',
      summary: 'List the models with their versions, states, serving versions, pinned and unloaded',
      positionals: [],
      flags: [],
      handler: list,
    }),
    command<CommandHandler>({
      name: 'show',
      summary: 'Show a model: versions and states, signatures, batching, processing, rollout, cache, labels',
      positionals: [NAME],
      flags: [],
      handler: show,
    }),
    command<CommandHandler>({
      name: 'load',
      summary: 'Load a model that was unloaded: the versions its policy selects load again',
      positionals: [NAME],
      flags: [],
      handler: (ctx) => setUnloaded(ctx, false),
    }),
    command<CommandHandler>({
      name: 'unload',
      summary: 'Unload a model: its versions drain and no version serves until it is loaded again',
      positionals: [NAME],
      flags: [],
      handler: (ctx) => setUnloaded(ctx, true),
    }),
    command<CommandHandler>({
      name: 'retire',
      summary: 'Retire a version: it drains and is unloaded for good (refused while it takes traffic)',
      positionals: [NAME],
      flags: [
        { name: 'version', kind: 'value', placeholder: '<id>', required: true, description: 'The version to retire' },
      ],
      handler: retire,
    }),
    command<CommandHandler>({
      name: 'delete',
      summary: 'Delete a model and its versions (refused while one of them takes traffic)',
      positionals: [NAME],
      flags: [],
      handler: remove,
    }),
    command<CommandHandler>({
      name: 'set-policy',
      summary: 'Choose which versions serve: the latest N, specific ones, or all',
      details: 'Exactly one of --latest, --specific or --all. Versions that leave the policy drain, then retire.',
      positionals: [NAME],
      flags: [
        {
          name: 'latest',
          kind: 'value',
          placeholder: '<n>',
          description: 'The n highest READY versions (plus any newer one still loading)',
        },
        {
          name: 'specific',
          kind: 'value',
          placeholder: '<ids>',
          description: 'Exactly these versions, comma-separated: 1,2',
        },
        { name: 'all', kind: 'switch', description: 'Every version' },
      ],
      handler: setPolicy,
    }),
  ],
};
