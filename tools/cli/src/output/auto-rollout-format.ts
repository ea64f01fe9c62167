import { decisionName as rolloutDecisionName, phaseName as rolloutPhaseName } from '@infermesh/rollout';
import { formatDurationMs } from '@infermesh/mesh';
import { type Timestamp, timestampDate, timestampMs } from '@bufbuild/protobuf/wkt';
import {
  type AutoRollout,
  type AutoRolloutAnalysis,
  AutoRolloutPhase,
  type GateResult,
  type Model,
  type RolloutDecision,
  type RolloutEvent,
  type StepFigures,
  type VersionFigures,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { modelIdOf } from '@infermesh/rollout';
import { formatRollout, table } from './format';

// How `infermesh rollout show`, `rollout history` and `rollout auto --wait` print a model's automatic
// rollout: the registry decides, these only say what it decided and on which figures.

/** PROGRESSING, PAUSED, ... */
export function phaseName(phase: AutoRolloutPhase): string {
  return rolloutPhaseName(phase).toUpperCase();
}

/** STARTED, ADVANCED, ... */
export function decisionName(decision: RolloutDecision): string {
  return rolloutDecisionName(decision).toUpperCase();
}

/** The phases an automatic rollout ends in. */
export function isFinished(phase: AutoRolloutPhase): boolean {
  return (
    phase === AutoRolloutPhase.PROMOTED || phase === AutoRolloutPhase.ROLLED_BACK || phase === AutoRolloutPhase.ABORTED
  );
}

/** Time gone by: "42.0 s", "12m 5s", "2h 3m". */
export function formatElapsed(ms: number): string {
  if (ms < 60_000) return `${(Math.max(0, ms) / 1000).toFixed(1)} s`;
  const seconds = Math.floor(ms / 1000);
  if (seconds < 3600) return `${Math.floor(seconds / 60)}m ${seconds % 60}s`;
  return `${Math.floor(seconds / 3600)}h ${Math.floor((seconds % 3600) / 60)}m`;
}

const number = (value: number) => String(Number(value.toPrecision(4)));
const percentOf = (fraction: number) => `${Number((fraction * 100).toPrecision(3))}%`;
const time = (at: Timestamp | undefined) => (at === undefined ? '-' : timestampDate(at).toISOString());

/** "2/5 at 10%": the step (1-based) of the steps, and the canary's share in it. */
function stepText(step: number, percent: number, analysis: AutoRolloutAnalysis | undefined): string {
  const of = analysis === undefined || analysis.steps.length === 0 ? '' : `/${analysis.steps.length}`;
  return `${step + 1}${of} at ${number(percent)}%`;
}

/** "412 req, 0.243% errors, p99 41.2 ms, agreement 99.6%" (agreement only when shadow items were compared). */
export function summarizeFigures(figures: VersionFigures | undefined): string {
  if (figures === undefined) return '-';
  const parts = [`${figures.requests} req`, `${percentOf(figures.errorRate)} errors`, `p99 ${p99(figures)}`];
  if (figures.shadowItems > 0n) parts.push(`agreement ${percentOf(figures.agreement)}`);
  return parts.join(', ');
}

function p99(figures: VersionFigures): string {
  return figures.requests > figures.errors && figures.p99Ms > 0 ? `${number(figures.p99Ms)} ms` : '-';
}

/** The gates that apply, and the threshold each is held to (agreement is a least, the others a most). */
function thresholdText(gate: GateResult): string {
  return `${gate.gate === 'agreement' ? 'min' : 'max'} ${number(gate.threshold)}`;
}

function gateResult(gate: GateResult): string {
  const verdict = !gate.checked ? 'not checked' : gate.passed ? 'passed' : 'FAILED';
  return gate.note === '' ? verdict : `${verdict}: ${gate.note}`;
}

function figureRows(label: string, figures: VersionFigures): string[] {
  return [
    `${figures.version || '?'} (${label})`,
    String(figures.requests),
    String(figures.errors),
    percentOf(figures.errorRate),
    p99(figures),
    figures.shadowItems > 0n ? `${percentOf(figures.agreement)} of ${figures.shadowItems}` : '-',
  ];
}

function indent(text: string, by: string): string[] {
  return text
    .trimEnd()
    .split('\n')
    .map((line) => `${by}${line}`);
}

/** The last figures: each version's, then each gate's verdict. */
function formatFigures(figures: StepFigures, reference: VersionFigures | undefined): string[] {
  const rows: string[][] = [];
  if (figures.canary !== undefined) rows.push(figureRows('canary', figures.canary));
  if (figures.stable !== undefined) rows.push(figureRows('stable', figures.stable));
  if (reference !== undefined) rows.push(figureRows('stable, reference', reference));
  const lines = [`  figures over ${formatElapsed(Number(figures.elapsedMs))} of the step:`];
  if (rows.length > 0)
    lines.push(...indent(table(['VERSION', 'REQUESTS', 'ERRORS', 'ERROR RATE', 'P99', 'AGREEMENT'], rows), '    '));
  if (reference !== undefined)
    lines.push(
      '    (reference: the stable version over the last step in which it served the minimum of requests; the comparison once the canary takes nearly all of them)',
    );
  if (figures.gates.length > 0) {
    lines.push('  gates:');
    lines.push(
      ...indent(
        table(
          ['GATE', 'VALUE', 'THRESHOLD', 'RESULT'],
          figures.gates.map((g) => [g.gate, g.checked ? number(g.value) : '-', thresholdText(g), gateResult(g)]),
        ),
        '    ',
      ),
    );
  }
  return lines;
}

/** The gates an analysis sets, as the flags of `rollout auto` name them. */
function gatesOf(analysis: AutoRolloutAnalysis): string {
  const gates: string[] = [];
  if (analysis.maxErrorRateIncrease !== undefined)
    gates.push(`error rate at most ${number(analysis.maxErrorRateIncrease)} above the stable's`);
  if (analysis.maxP99Ratio !== undefined) gates.push(`p99 at most ${number(analysis.maxP99Ratio)}× the stable's`);
  if (analysis.minAgreement !== undefined) gates.push(`shadow agreement at least ${number(analysis.minAgreement)}`);
  if (analysis.maxBurnRate !== undefined)
    gates.push(`burn rate at most ${number(analysis.maxBurnRate)} of a ${number(analysis.objective)}% objective`);
  return gates.join('; ') || 'none';
}

/**
 * A model's automatic rollout, for `rollout show`: its phase, canary and stable versions, the step
 * and the canary's share, the time in the step (up to `nowMs` while it progresses), why it is where
 * it is, the analysis, and the figures it last checked with each gate's verdict. Empty without one.
 */
export function formatAutoRollout(model: Model, nowMs: number): string {
  const rollout = model.autoRollout;
  if (rollout === undefined) return '';
  const { analysis } = rollout;
  const percent = analysis?.steps[rollout.step] ?? 0;
  const rows: [string, string][] = [];
  let step = stepText(rollout.step, percent, analysis);
  if (rollout.stepStartTime !== undefined) {
    const until =
      rollout.phase === AutoRolloutPhase.PROGRESSING || rollout.updateTime === undefined
        ? nowMs
        : timestampMs(rollout.updateTime);
    step += `, for ${formatElapsed(until - timestampMs(rollout.stepStartTime))}`;
  }
  rows.push(['step', step]);
  if (rollout.reason !== '') rows.push(['reason', rollout.reason]);
  if (analysis !== undefined) {
    rows.push([
      'steps',
      `${analysis.steps.map(number).join(', ')}%, each at least ${formatDurationMs(Number(analysis.intervalMs))} and ${analysis.minRequests} canary requests`,
    ]);
    rows.push(['gates', gatesOf(analysis)]);
  }
  rows.push(['started', time(rollout.startTime)]);
  const width = Math.max(...rows.map(([label]) => label.length));
  const lines = [
    `Automatic rollout of ${modelIdOf(model.name)} version ${rollout.canaryVersion} against stable ${rollout.stableVersion || '-'}: ${phaseName(rollout.phase)}`,
    ...rows.map(([label, text]) => `  ${label.padEnd(width)}  ${text}`),
  ];
  if (rollout.figures !== undefined) lines.push(...formatFigures(rollout.figures, rollout.stableReference));
  return `${lines.join('\n')}\n`;
}

/** The analysis of the rollout an event belongs to, when the model still has it. */
function analysisOf(model: Model, event: RolloutEvent): AutoRolloutAnalysis | undefined {
  return model.autoRollout?.id === event.rolloutId ? model.autoRollout.analysis : undefined;
}

/**
 * One decision on a line, for `rollout auto --wait`: "<time>  ADVANCED  version 3, step 2/5 at 10%:
 * <reason>; canary ..., stable ...".
 */
export function formatDecision(event: RolloutEvent, rollout: AutoRollout | undefined): string {
  const analysis = rollout?.id === event.rolloutId ? rollout.analysis : undefined;
  const { figures } = event;
  const details = [event.reason];
  if (figures?.canary !== undefined) details.push(`canary ${summarizeFigures(figures.canary)}`);
  if (figures?.stable !== undefined) details.push(`stable ${summarizeFigures(figures.stable)}`);
  const said = details.filter((d) => d !== '').join('; ');
  const head = `${time(event.time)}  ${decisionName(event.decision)}  version ${event.version}, step ${stepText(event.step, event.percent, analysis)}`;
  return `${head}${said === '' ? '' : `: ${said}`}\n`;
}

/** `rollout history`: every decision of the model's automatic rollouts, oldest first, with the figures it was made on. */
export function formatRolloutHistory(model: Model): string {
  // The registry keeps them oldest first.
  const events = model.rolloutHistory;
  if (events.length === 0)
    return `No automatic rollout of ${modelIdOf(model.name)} yet: start one with \`infermesh rollout auto ${modelIdOf(model.name)} --version <id>\`.\n`;
  return table(
    ['TIME', 'DECISION', 'VERSION', 'STEP', 'PERCENT', 'CANARY', 'STABLE', 'REASON'],
    events.map((e) => {
      const analysis = analysisOf(model, e);
      return [
        time(e.time),
        decisionName(e.decision),
        e.version,
        analysis === undefined ? String(e.step + 1) : `${e.step + 1}/${analysis.steps.length}`,
        `${number(e.percent)}%`,
        summarizeFigures(e.figures?.canary),
        summarizeFigures(e.figures?.stable),
        e.reason || '-',
      ];
    }),
  );
}

/** The rollout policy, then the automatic rollout when the model has one: what the rollout commands print. */
export function formatFullRollout(model: Model, nowMs: number): string {
  const auto = formatAutoRollout(model, nowMs);
  return auto === '' ? formatRollout(model) : `${formatRollout(model)}\n${auto}`;
}
