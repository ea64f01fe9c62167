import { describeAccuracy } from '@infermesh/quantization';
import { type Lineage, ModelVersionSchema } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { versionIdOf } from '@infermesh/rollout';
import { parseNonNegative, parseSeconds, parseVersionId } from './args';
import type { CommandContext } from './command-context';
import { executionOf, followUntilReady } from './model-register';
import { formatBytes, formatSeconds } from './output/format';
import { readWarmUpFile } from './warm-up-file';

export const DEFAULT_QUANTIZE_TIMEOUT_S = 300;

/**
 * `infermesh models quantize`: asks the registry for an int8 variant of a version (the registry
 * quantizes, runs both on the calibration inputs, and registers the variant when it passes the gate),
 * prints the figures, then follows the variant until it is READY like `models register`.
 */
export async function quantize(ctx: CommandContext): Promise<void> {
  const { args } = ctx;
  const name = args.positionals[0]!;
  const version = args.value('version');
  const source =
    version === undefined ? `models/${name}` : `models/${name}/versions/${parseVersionId(version, '--version')}`;
  const target = args.value('as');
  const newVersion = args.value('new-version');
  const maxRelL2 = args.value('max-rel-l2');
  const maxRelativeL2 = maxRelL2 === undefined ? undefined : parseNonNegative(maxRelL2, '--max-rel-l2', '0.02');
  const calibrationFile = args.value('calibration');
  const calibration =
    calibrationFile === undefined ? [] : (await readWarmUpFile(calibrationFile, '--calibration')).samples;
  const timeoutMs = parseSeconds(args.value('timeout') ?? String(DEFAULT_QUANTIZE_TIMEOUT_S), '--timeout') * 1000;
  const execution = executionOf(args);
  const started = ctx.clock.monotonic();
  const session = ctx.gateway();
  const { version: derived } = await session.registry.quantizeModelVersion(
    {
      source,
      targetModel: target === undefined ? '' : `models/${target}`,
      versionId: newVersion === undefined ? '' : parseVersionId(newVersion, '--new-version'),
      calibration,
      ...(maxRelativeL2 !== undefined && { maxRelativeL2 }),
      settings: {
        ...(args.switch('per-tensor') && { perChannel: false }),
        ...(args.switch('conv') && { quantizeConv: true }),
        ...(args.switch('full-range') && { reduceRange: false }),
      },
      ...(execution !== undefined && { execution }),
    },
    session.call(timeoutMs),
  );
  if (derived === undefined || derived.lineage === undefined)
    throw new Error(`the gateway returned no derived version for ${source}`);
  const label = `${derived.name.split('/')[1]} version ${versionIdOf(derived.name)}`;
  ctx.note(
    `${label} derived from ${derived.lineage.sourceVersion}: ${summarizeLineage(derived.lineage, derived.artifact?.sizeBytes)}\n`,
  );
  const ready = await followUntilReady(
    ctx,
    session,
    derived.name,
    label,
    Math.max(1, timeoutMs - (ctx.clock.monotonic() - started)),
  );
  ctx.result(
    ModelVersionSchema,
    ready,
    () => `${label} is READY in ${formatSeconds(ctx.clock.monotonic() - started)}\n`,
  );
}

/** "dynamic_int8, 3 nodes quantized, 1 kept in float; relative L2 0.0108, ... (gate 0.02); artifact 6.0 MiB". */
export function summarizeLineage(lineage: Lineage, artifactBytes?: bigint): string {
  const accuracy = lineage.accuracy === undefined ? 'no accuracy figures' : describeAccuracy(lineage.accuracy);
  const quantized = Math.max(lineage.quantizedNodeCount, lineage.quantizedNodes.length);
  const kept = Math.max(lineage.floatNodeCount, lineage.floatNodes.length);
  return (
    `${lineage.method}, ${quantized} node${quantized === 1 ? '' : 's'} quantized, ${kept} kept in float; ${accuracy}` +
    `${lineage.accuracy === undefined ? '' : ` (gate ${lineage.accuracy.maxRelativeL2})`}${artifactBytes === undefined ? '' : `; artifact ${formatBytes(Number(artifactBytes))}`}`
  );
}
