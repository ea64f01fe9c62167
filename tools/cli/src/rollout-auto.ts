import { formatDurationMs } from '@infermesh/mesh';
import { create } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import { RpcError } from '@infermesh/grpc';
import {
  type AutoRolloutAnalysis,
  AutoRolloutAnalysisSchema,
  AutoRolloutPhase,
  type Model,
  ModelSchema,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { checkAnalysis, modelIdOf } from '@infermesh/rollout';
import {
  type FlagSpec,
  type ParsedArgs,
  parseDuration,
  parseFraction,
  parseInteger,
  parsePositive,
  parseVersionId,
} from './args';
import { CommandFailure, UsageError } from './cli-errors';
import type { CommandContext } from './command-context';
import type { GatewaySession } from './gateway-session';
import { formatDecision, formatFullRollout, isFinished, phaseName } from './output/auto-rollout-format';

/** The analysis `rollout auto` asks for unless its flags say otherwise (no burn-rate gate unless --max-burn-rate). */
export const AUTO_ROLLOUT_DEFAULTS = {
  steps: [5, 10, 25, 50, 100],
  intervalMs: 60_000,
  minRequests: 200,
  maxErrorRateIncrease: 0.005,
  maxP99Ratio: 1.2,
  minAgreement: 0.99,
  objective: 99.5,
} as const;

/** How often `--wait` reads the model. */
const POLL_INTERVAL_MS = 1_000;
/** Polls in a row that may fail with UNAVAILABLE (a gateway or registry restarting) before `--wait` gives up. */
const MAX_UNREACHABLE_POLLS = 30;

const D = AUTO_ROLLOUT_DEFAULTS;

/** The flags of `rollout auto`. */
export const AUTO_ROLLOUT_FLAGS: readonly FlagSpec[] = [
  { name: 'version', kind: 'value', placeholder: '<id>', description: 'The READY version to roll out as the canary' },
  {
    name: 'steps',
    kind: 'value',
    placeholder: '<p,p,...>',
    description: `The canary's percents, increasing, the last 100 (default ${D.steps.join(',')})`,
  },
  {
    name: 'interval',
    kind: 'value',
    placeholder: '<duration>',
    description: `The least time each step lasts: 30s, 1m, 500ms (default ${formatDurationMs(D.intervalMs)})`,
  },
  {
    name: 'min-requests',
    kind: 'value',
    placeholder: '<n>',
    description: `Requests the canary serves in a step before its gates are checked (default ${D.minRequests})`,
  },
  {
    name: 'max-error-rate-increase',
    kind: 'value',
    placeholder: '<x>',
    description: `The most the canary's error rate (a fraction) may exceed the stable version's (default ${D.maxErrorRateIncrease})`,
  },
  {
    name: 'max-p99-ratio',
    kind: 'value',
    placeholder: '<x>',
    description: `The most the canary's p99 latency over a step may be, as a multiple of the stable version's (default ${D.maxP99Ratio})`,
  },
  {
    name: 'min-agreement',
    kind: 'value',
    placeholder: '<x>',
    description: `The least share of shadow-compared items the canary must agree on, in steps that compared any (default ${D.minAgreement})`,
  },
  {
    name: 'max-burn-rate',
    kind: 'value',
    placeholder: '<x>',
    description:
      'The most the canary may burn its error budget: its error rate over (1 - objective/100) (default: no such gate)',
  },
  {
    name: 'objective',
    kind: 'value',
    placeholder: '<percent>',
    description: `The availability objective --max-burn-rate is measured against (default ${D.objective})`,
  },
  {
    name: 'resume',
    kind: 'switch',
    description: "Resume the model's paused automatic rollout at its step, with its own analysis",
  },
  {
    name: 'wait',
    kind: 'switch',
    description:
      'Follow the rollout, a line per decision, until it is promoted (exit 0), rolled back or aborted (exit 1)',
  },
];

const ANALYSIS_FLAGS = [
  'steps',
  'interval',
  'min-requests',
  'max-error-rate-increase',
  'max-p99-ratio',
  'min-agreement',
  'max-burn-rate',
  'objective',
];

/** "5,10,25,50,100": numbers, each an optional "%" after it (checkAnalysis then says whether they make steps). */
function parseSteps(value: string): number[] {
  return value.split(',').map((part) => {
    const text = part.trim().replace(/%$/, '');
    const n = Number(text);
    if (text === '' || !Number.isFinite(n))
      throw new UsageError(
        `--steps must be percents separated by commas, such as ${D.steps.join(',')}, got "${value}"`,
      );
    return n;
  });
}

/** The analysis the flags ask for, every default filled in; each bad value a UsageError naming its flag. */
export function analysisFromFlags(args: ParsedArgs): AutoRolloutAnalysis {
  const value = (flag: string) => args.value(flag);
  const maxBurnRate = value('max-burn-rate');
  const objective = value('objective');
  if (objective !== undefined && maxBurnRate === undefined)
    throw new UsageError('--objective applies only with --max-burn-rate, the gate it is measured for');
  const analysis = create(AutoRolloutAnalysisSchema, {
    steps: value('steps') === undefined ? [...D.steps] : parseSteps(value('steps')!),
    intervalMs: BigInt(
      value('interval') === undefined ? D.intervalMs : parseDuration(value('interval')!, '--interval'),
    ),
    minRequests: BigInt(
      value('min-requests') === undefined ? D.minRequests : parseInteger(value('min-requests')!, '--min-requests', 1),
    ),
    maxErrorRateIncrease: parseFraction(
      value('max-error-rate-increase') ?? String(D.maxErrorRateIncrease),
      '--max-error-rate-increase',
      String(D.maxErrorRateIncrease),
    ),
    maxP99Ratio: parsePositive(
      value('max-p99-ratio') ?? String(D.maxP99Ratio),
      '--max-p99-ratio',
      String(D.maxP99Ratio),
    ),
    minAgreement: parseFraction(
      value('min-agreement') ?? String(D.minAgreement),
      '--min-agreement',
      String(D.minAgreement),
    ),
  });
  if (maxBurnRate !== undefined) {
    analysis.maxBurnRate = parsePositive(maxBurnRate, '--max-burn-rate', '2');
    analysis.objective = objective === undefined ? D.objective : Number(objective);
  }
  // The registry's own check (libs/rollout), so that a bad analysis is refused before any call.
  try {
    return checkAnalysis(analysis);
  } catch (error) {
    throw new UsageError(error instanceof Error ? error.message : String(error));
  }
}

/**
 * `infermesh rollout auto NAME --version V` starts an automatic rollout (StartAutoRollout), `--resume`
 * resumes a paused one; prints the rollout, or with `--wait` follows it to its end.
 */
export async function autoRollout(ctx: CommandContext): Promise<void> {
  const { args } = ctx;
  const name = args.positionals[0]!;
  let request: Parameters<GatewaySession['registry']['startAutoRollout']>[0];
  if (args.switch('resume')) {
    const given = ['version', ...ANALYSIS_FLAGS].filter((flag) => args.has(flag));
    if (given.length > 0)
      throw new UsageError(
        `--resume takes no --${given[0]}: the paused rollout goes on with its own version and analysis`,
      );
    request = { model: `models/${name}`, resume: true };
  } else {
    const version = args.value('version');
    if (version === undefined)
      throw new UsageError('give --version <id> to start an automatic rollout, or --resume to resume a paused one');
    request = {
      model: `models/${name}`,
      version: parseVersionId(version, '--version'),
      analysis: analysisFromFlags(args),
    };
  }
  const session = ctx.gateway();
  const { model } = await session.registry.startAutoRollout(request, session.call());
  if (model === undefined) throw new Error(`the gateway returned no model for "${name}"`);
  if (!args.switch('wait')) {
    ctx.result(ModelSchema, model, () => formatFullRollout(model, ctx.clock.now()));
    return;
  }
  const last = await follow(ctx, session, model);
  ctx.result(ModelSchema, last, () => formatFullRollout(last, ctx.clock.now()));
  const rollout = last.autoRollout!;
  const label = `${modelIdOf(last.name)} version ${rollout.canaryVersion}`;
  if (rollout.phase === AutoRolloutPhase.ROLLED_BACK)
    throw new CommandFailure(`${label} was rolled back: ${rollout.reason || 'the registry gives no reason'}`);
  if (rollout.phase === AutoRolloutPhase.ABORTED)
    throw new CommandFailure(
      `the automatic rollout of ${label} was aborted: ${rollout.reason || 'the registry gives no reason'}`,
    );
}

/**
 * Reads the model every second until its automatic rollout is PROMOTED, ROLLED_BACK or ABORTED, and
 * returns it then; prints each decision of the rollout as it appears in the model's history. A
 * rollout replaced by another is a CommandFailure; a gateway unreachable for a while is waited out.
 */
async function follow(ctx: CommandContext, session: GatewaySession, first: Model): Promise<Model> {
  const id = first.autoRollout?.id;
  if (id === undefined) throw new Error(`the gateway returned ${first.name} without its automatic rollout`);
  const shown = new Set<string>();
  let pausedNoted = false;
  let model = first;
  for (;;) {
    const rollout = model.autoRollout;
    for (const event of model.rolloutHistory.filter((e) => e.rolloutId === id)) {
      const key = `${event.time?.seconds}.${event.time?.nanos}/${event.decision}/${event.step}`;
      if (shown.has(key)) continue;
      shown.add(key);
      ctx.note(formatDecision(event, rollout));
    }
    const modelId = modelIdOf(model.name);
    if (rollout?.id !== id) {
      const other = rollout === undefined ? '' : ` (of version ${rollout.canaryVersion})`;
      throw new CommandFailure(
        `the automatic rollout of ${modelId} was replaced by another${other}: follow it with \`infermesh rollout show ${modelId}\``,
      );
    }
    if (isFinished(rollout.phase)) return model;
    if (rollout.phase === AutoRolloutPhase.PAUSED && !pausedNoted) {
      ctx.note(
        `The rollout is ${phaseName(rollout.phase)}; waiting until it is resumed (\`infermesh rollout auto ${modelId} --resume\`).\n`,
      );
    }
    pausedNoted = rollout.phase === AutoRolloutPhase.PAUSED;
    await new Promise((resolve) => setTimeout(resolve, POLL_INTERVAL_MS));
    model = await poll(ctx, session, model.name);
  }
}

/** GetModel, retried every second while the gateway or the registry is UNAVAILABLE, at most MAX_UNREACHABLE_POLLS times in a row. */
async function poll(ctx: CommandContext, session: GatewaySession, name: string): Promise<Model> {
  for (let failures = 0; ; failures++) {
    try {
      const { model } = await session.registry.getModel({ name }, session.call());
      if (model === undefined) throw new Error(`the gateway returned no model for ${name}`);
      return model;
    } catch (error) {
      if (!(error instanceof RpcError) || error.code !== status.UNAVAILABLE || failures + 1 >= MAX_UNREACHABLE_POLLS)
        throw error;
      if (failures === 0) ctx.note(`Cannot read ${name} (${error.message}); retrying every second.\n`);
      await new Promise((resolve) => setTimeout(resolve, POLL_INTERVAL_MS));
    }
  }
}
