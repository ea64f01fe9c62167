import { clone, create, type MessageInitShape } from '@bufbuild/protobuf';
import {
  type Model,
  ModelSchema,
  type RolloutPolicy,
  RolloutPolicySchema,
  type UpdateRolloutRequestSchema,
  VersionState,
  WeightedVersionSchema,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { compareVersionIds, stableVersion, versionIdOf } from '@infermesh/rollout';
import { command, type GroupSpec, parsePercent, parseVersionId, parseVersionShare } from './args';
import { UsageError } from './cli-errors';
import type { CommandContext, CommandHandler } from './command-context';
import { GATEWAY_FLAGS } from './gateway-flags';
import { getModel } from './models.command';
import { formatFullRollout, formatRolloutHistory } from './output/auto-rollout-format';
import { AUTO_ROLLOUT_FLAGS, autoRollout } from './rollout-auto';

/**
 * Pins the stable version when the policy leaves it to "the latest READY version", so that a version
 * the policy now names (a canary, a variant, a shadow) does not take the rest of the traffic when it
 * becomes the latest READY one: the version that takes it now keeps it, or, when that is one of the
 * versions named, the latest READY version that is not, else the latest one still DRAINING (replaced
 * moments ago by the version now named: naming it in the policy makes it serve again). With none
 * there is no traffic to keep and the stable version stays unset.
 */
export function keepStable(model: Model, policy: RolloutPolicy): void {
  if (policy.stableVersion !== '') return;
  const named = new Set([policy.canary?.version, ...policy.variants.map((v) => v.version), policy.shadow?.version]);
  const current = stableVersion(model);
  if (current !== undefined && !named.has(versionIdOf(current.name))) {
    policy.stableVersion = versionIdOf(current.name);
    return;
  }
  const latestIn = (state: VersionState) =>
    model.versions
      .filter((v) => v.state === state && !named.has(versionIdOf(v.name)))
      .map((v) => versionIdOf(v.name))
      .sort(compareVersionIds)
      .pop();
  const other = latestIn(VersionState.READY) ?? latestIn(VersionState.DRAINING);
  if (other !== undefined) policy.stableVersion = other;
}

/** The model's policy with `change` applied, its stable version set by --stable or kept (keepStable). */
function edited(
  ctx: CommandContext,
  model: Model,
  change: (policy: RolloutPolicy) => void,
  pinStable: boolean,
): RolloutPolicy {
  const policy = model.rollout === undefined ? create(RolloutPolicySchema) : clone(RolloutPolicySchema, model.rollout);
  change(policy);
  const stable = ctx.args.value('stable');
  if (stable !== undefined) policy.stableVersion = parseVersionId(stable, '--stable');
  else if (pinStable) keepStable(model, policy);
  return policy;
}

/** Reads the model, changes its policy and stores it with SetRolloutPolicy; prints the new rollout. */
async function setPolicy(
  ctx: CommandContext,
  change: (policy: RolloutPolicy) => void,
  pinStable: boolean,
): Promise<void> {
  const current = await getModel(ctx, ctx.args.positionals[0]!);
  const policy = edited(ctx, current, change, pinStable);
  const session = ctx.gateway();
  const { model } = await session.registry.setRolloutPolicy({ model: current.name, policy }, session.call());
  if (model === undefined) throw new Error(`the gateway returned no model for ${current.name}`);
  ctx.result(ModelSchema, model, () => formatFullRollout(model, ctx.clock.now()));
}

async function update(
  ctx: CommandContext,
  action: MessageInitShape<typeof UpdateRolloutRequestSchema>['action'],
): Promise<void> {
  const session = ctx.gateway();
  const { model } = await session.registry.updateRollout(
    { model: `models/${ctx.args.positionals[0]!}`, action },
    session.call(),
  );
  if (model === undefined) throw new Error(`the gateway returned no model for "${ctx.args.positionals[0]}"`);
  ctx.result(ModelSchema, model, () => formatFullRollout(model, ctx.clock.now()));
}

async function show(ctx: CommandContext): Promise<void> {
  const model = await getModel(ctx, ctx.args.positionals[0]!);
  ctx.result(ModelSchema, model, () => formatFullRollout(model, ctx.clock.now()));
}

async function history(ctx: CommandContext): Promise<void> {
  const model = await getModel(ctx, ctx.args.positionals[0]!);
  ctx.result(ModelSchema, model, () => formatRolloutHistory(model));
}

async function stable(ctx: CommandContext): Promise<void> {
  const version = parseVersionId(ctx.args.required('version'), '--version');
  await setPolicy(ctx, (policy) => (policy.stableVersion = version), false);
}

async function canary(ctx: CommandContext): Promise<void> {
  const version = parseVersionId(ctx.args.required('version'), '--version');
  const percent = parsePercent(ctx.args.required('percent'), '--percent');
  await setPolicy(ctx, (policy) => (policy.canary = create(WeightedVersionSchema, { version, percent })), true);
}

async function ab(ctx: CommandContext): Promise<void> {
  const variants = ctx.args.list('variant').map((v) => parseVersionShare(v, '--variant'));
  const repeated = variants.find((v, i) => variants.findIndex((w) => w.version === v.version) !== i);
  if (repeated !== undefined) throw new UsageError(`--variant names version ${repeated.version} more than once`);
  await setPolicy(ctx, (policy) => (policy.variants = variants.map((v) => create(WeightedVersionSchema, v))), true);
}

async function shadow(ctx: CommandContext): Promise<void> {
  const { args } = ctx;
  if (args.switch('off')) {
    if (args.has('version') || args.has('percent')) throw new UsageError('--off takes neither --version nor --percent');
    await setPolicy(ctx, (policy) => (policy.shadow = undefined), false);
    return;
  }
  if (!args.has('version') || !args.has('percent'))
    throw new UsageError('give --version <id> and --percent <p>, or --off');
  const version = parseVersionId(args.required('version'), '--version');
  const percent = parsePercent(args.required('percent'), '--percent');
  await setPolicy(ctx, (policy) => (policy.shadow = create(WeightedVersionSchema, { version, percent })), true);
}

async function fallback(ctx: CommandContext): Promise<void> {
  const { args } = ctx;
  const model = args.value('model');
  if (args.switch('off') === (model !== undefined)) throw new UsageError('give either --model <name> or --off');
  if (model === '') throw new UsageError('--model needs a model name; --off removes the fallback');
  await setPolicy(ctx, (policy) => (policy.fallbackModel = model ?? ''), false);
}

async function weights(ctx: CommandContext): Promise<void> {
  const percents: Record<string, number> = {};
  for (const share of ctx.args.positionals.slice(1).map((s) => parseVersionShare(s, 'a weight'))) {
    if (share.version in percents) throw new UsageError(`version ${share.version} is given more than once`);
    percents[share.version] = share.percent;
  }
  await update(ctx, { case: 'setWeights', value: { percents } });
}

async function promote(ctx: CommandContext): Promise<void> {
  const version = ctx.args.value('version');
  await update(ctx, { case: 'promote', value: version === undefined ? '' : parseVersionId(version, '--version') });
}

const NAME = { name: '<name>' };
const STABLE_FLAG = {
  name: 'stable',
  kind: 'value',
  placeholder: '<id>',
  description: 'The version that takes the rest of the traffic (default: the one that takes it now)',
} as const;

/** `infermesh rollout ...`: how requests that name no version are spread over a model's versions. */
export const ROLLOUT_GROUP: GroupSpec<CommandHandler> = {
  kind: 'group',
  name: 'rollout',
  summary:
    "Spread a model's traffic over its versions: canary, A/B, shadow, fallback, promote, roll back, automatic rollouts",
  flags: GATEWAY_FLAGS,
  commands: [
    command<CommandHandler>({
      name: 'show',
      summary: "Show a model's rollout: stable version, canary, variants, shadow, fallback, and its automatic rollout",
      details:
        "An automatic rollout shows with its phase, canary and stable versions, step and share, time in the step,\nreason, analysis, and the figures it last checked: each version's requests, errors, p99 and shadow\nagreement, and each gate's value against its threshold (passed, FAILED, or not checked and why).",
      positionals: [NAME],
      flags: [],
      handler: show,
    }),
    command<CommandHandler>({
      name: 'auto',
      summary:
        'Roll a version out automatically: the registry moves it through the steps while it holds up on every gate',
      details: [
        "The version becomes the canary at the first step's share. A step passes once --interval has gone by,",
        'the canary has served --min-requests in it and every gate holds against the stable version; the',
        'error gates are checked as soon as the canary has served --min-requests, so one it fails rolls it',
        'back at once, and the latency gate over the whole step once --interval has gone by. After the last',
        'step it is promoted and the old stable version drains. Any manual rollout change (canary, weights,',
        'promote, rollback, pause...) pauses it; --resume goes on.',
        '--wait exits 0 once it is promoted, 1 when it is rolled back or aborted.',
      ].join('\n'),
      positionals: [NAME],
      flags: AUTO_ROLLOUT_FLAGS,
      handler: autoRollout,
    }),
    command<CommandHandler>({
      name: 'pause',
      summary: "Pause the model's automatic rollout where it is; the traffic split stays (resume: auto --resume)",
      positionals: [NAME],
      flags: [],
      handler: (ctx) => update(ctx, { case: 'pause', value: true }),
    }),
    command<CommandHandler>({
      name: 'history',
      summary: "List the decisions of the model's automatic rollouts, oldest first, with the figures each was made on",
      details: 'With --json, the model, whose rolloutHistory holds them (the last 100).',
      positionals: [NAME],
      flags: [],
      handler: history,
    }),
    command<CommandHandler>({
      name: 'stable',
      summary: 'Pin the version that takes the traffic the canary and the variants leave',
      details:
        'Pin it before registering a version you want to try as a canary: otherwise the new version takes\nevery request once it is READY (it becomes the latest READY version).',
      positionals: [NAME],
      flags: [
        { name: 'version', kind: 'value', placeholder: '<id>', required: true, description: 'The stable version' },
      ],
      handler: stable,
    }),
    command<CommandHandler>({
      name: 'canary',
      summary: 'Send a random share of the requests to a version',
      details:
        'The rest of the traffic stays where it is: when no stable version is set, it is pinned to the\nversion that takes the traffic now.',
      positionals: [NAME],
      flags: [
        { name: 'version', kind: 'value', placeholder: '<id>', required: true, description: 'The canary version' },
        {
          name: 'percent',
          kind: 'value',
          placeholder: '<p>',
          required: true,
          description: 'Its share of the requests, 0 to 100',
        },
        STABLE_FLAG,
      ],
      handler: canary,
    }),
    command<CommandHandler>({
      name: 'ab',
      summary: 'Run an A/B experiment: each variant takes a sticky share of routing keys',
      details:
        "Replaces the variants. The canary's and the variants' percents add up to at most 100; the\nrest goes to the stable version, pinned as for a canary.",
      positionals: [NAME],
      flags: [
        {
          name: 'variant',
          kind: 'list',
          placeholder: '<id>=<p>',
          required: true,
          description: 'A variant version and its share of routing keys',
        },
        STABLE_FLAG,
      ],
      handler: ab,
    }),
    command<CommandHandler>({
      name: 'shadow',
      summary: 'Mirror a share of the requests to a version in the background (its answers are only compared)',
      positionals: [NAME],
      flags: [
        { name: 'version', kind: 'value', placeholder: '<id>', description: 'The shadow version' },
        {
          name: 'percent',
          kind: 'value',
          placeholder: '<p>',
          description: 'The share of requests it mirrors, 0 to 100',
        },
        { name: 'off', kind: 'switch', description: 'Stop shadowing' },
        STABLE_FLAG,
      ],
      handler: shadow,
    }),
    command<CommandHandler>({
      name: 'fallback',
      summary: 'Name a model that answers (marked degraded) when this one cannot',
      positionals: [NAME],
      flags: [
        { name: 'model', kind: 'value', placeholder: '<name>', description: 'The fallback model' },
        { name: 'off', kind: 'switch', description: 'Remove the fallback' },
      ],
      handler: fallback,
    }),
    command<CommandHandler>({
      name: 'weights',
      summary: 'Set new shares for the canary and the variants in one step; versions not named keep theirs',
      positionals: [NAME, { name: '<id>=<p>', variadic: true }],
      flags: [],
      handler: weights,
    }),
    command<CommandHandler>({
      name: 'promote',
      summary: 'Make the canary (or a named canary or variant) the stable version and end the trial',
      positionals: [NAME],
      flags: [
        {
          name: 'version',
          kind: 'value',
          placeholder: '<id>',
          description: 'The version to promote (default: the canary)',
        },
      ],
      handler: promote,
    }),
    command<CommandHandler>({
      name: 'rollback',
      summary: 'End the canary and the variants: every request goes to the stable version',
      positionals: [NAME],
      flags: [],
      handler: (ctx) => update(ctx, { case: 'rollback', value: true }),
    }),
  ],
};
