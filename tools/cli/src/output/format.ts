import { type DescMessage, type MessageShape, toJson } from '@bufbuild/protobuf';
import { timestampDate } from '@bufbuild/protobuf/wkt';
import {
  type Batching,
  type CachePolicy,
  type Lineage,
  type Model,
  type ModelVersion,
  type Processing,
  type VersionPolicy,
  VersionState,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import type { TensorSpec } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { type ApiKey, type RateLimit, Scope } from '@infermesh/proto/gen/infermesh/gateway/v1/api_keys_pb';
import { describeAccuracy } from '@infermesh/quantization';
import { latestReady, modelIdOf, versionIdOf } from '@infermesh/rollout';
import { datatypeName, formatShape } from '@infermesh/tensors';

/** The protobuf JSON of a message (field names in lowerCamelCase, enums by name), indented. */
export function toJsonText<D extends DescMessage>(schema: D, message: MessageShape<D>): string {
  return `${JSON.stringify(toJson(schema, message), null, 2)}\n`;
}

const UNITS = ['KiB', 'MiB', 'GiB', 'TiB'];

/** 512 B, 1.5 KiB, 12.0 MiB. */
export function formatBytes(bytes: number): string {
  if (bytes < 1024) return `${Math.round(bytes)} B`;
  let value = bytes / 1024;
  let unit = 0;
  while (value >= 1024 && unit < UNITS.length - 1) {
    value /= 1024;
    unit++;
  }
  return `${value.toFixed(1)} ${UNITS[unit]}`;
}

export function formatRate(bytesPerSecond: number): string {
  return `${formatBytes(bytesPerSecond)}/s`;
}

/** 3.4 s */
export function formatSeconds(ms: number): string {
  return `${(ms / 1000).toFixed(1)} s`;
}

/** READY, LOADING, ... */
export function stateName(state: VersionState): string {
  return VersionState[state] ?? `STATE_${state}`;
}

const yesNo = (value: boolean) => (value ? 'yes' : 'no');

/** Rows under headers, each column as wide as its widest cell, two spaces apart. */
export function table(headers: readonly string[], rows: readonly (readonly string[])[]): string {
  const widths = headers.map((header, i) => Math.max(header.length, ...rows.map((row) => (row[i] ?? '').length)));
  const line = (cells: readonly string[]) =>
    cells
      .map((cell, i) => cell.padEnd(widths[i]!))
      .join('  ')
      .trimEnd();
  return `${[line(headers), ...rows.map(line)].join('\n')}\n`;
}

/** "1 READY, 2 LOADING", retired versions counted at the end. */
export function versionsSummary(model: Model): string {
  const live = model.versions.filter((v) => v.state !== VersionState.RETIRED);
  const retired = model.versions.length - live.length;
  const parts = live.map((v) => `${versionIdOf(v.name)} ${stateName(v.state)}`);
  if (retired > 0) parts.push(`${retired} retired`);
  return parts.join(', ') || 'none';
}

/** The versions that take requests now: the READY ones. */
export function servingVersions(model: Model): string[] {
  return model.versions.filter((v) => v.state === VersionState.READY).map((v) => versionIdOf(v.name));
}

/** `infermesh models list`. */
export function formatModelList(models: readonly Model[]): string {
  if (models.length === 0) return 'No models registered.\n';
  const sorted = [...models].sort((a, b) => a.name.localeCompare(b.name));
  return table(
    ['NAME', 'VERSIONS', 'SERVING', 'PINNED', 'UNLOADED'],
    sorted.map((m) => [
      modelIdOf(m.name),
      versionsSummary(m),
      servingVersions(m).join(', ') || '-',
      yesNo(m.pinned),
      yesNo(m.unloaded),
    ]),
  );
}

/** latest 1 (the default), latest 3, specific 1, 2, all. */
export function formatVersionPolicy(policy: VersionPolicy | undefined): string {
  switch (policy?.policy.case) {
    case undefined:
      return 'latest 1 (default)';
    case 'latest':
      return `latest ${policy.policy.value}`;
    case 'specific':
      return `specific ${policy.policy.value.versions.join(', ') || '(none)'}`;
    case 'all':
      return 'all';
  }
}

function versionState(model: Model, versionId: string): string {
  const version = model.versions.find((v) => versionIdOf(v.name) === versionId);
  return version === undefined ? 'not found' : stateName(version.state);
}

const percent = (value: number) => `${Number(value.toFixed(3))}%`;

/** How requests naming no version are spread over the model's versions. */
export function formatRollout(model: Model): string {
  const policy = model.rollout;
  const latest = latestReady(model);
  const latestText = latest === undefined ? 'none READY yet' : `now ${versionIdOf(latest.name)}`;
  const header = `Rollout of ${modelIdOf(model.name)}`;
  if (policy === undefined) {
    return `${header}: none; requests that name no version go to the latest READY version (${latestText}).\n`;
  }
  const rows: [string, string][] = [];
  rows.push([
    'stable',
    policy.stableVersion === ''
      ? `the latest READY version (${latestText})`
      : `${policy.stableVersion} (${versionState(model, policy.stableVersion)})`,
  ]);
  if (policy.canary !== undefined) {
    rows.push([
      'canary',
      `${policy.canary.version}: ${percent(policy.canary.percent)} of requests (${versionState(model, policy.canary.version)})`,
    ]);
  }
  policy.variants.forEach((variant, i) => {
    rows.push([
      i === 0 ? 'variants' : '',
      `${variant.version}: ${percent(variant.percent)} of routing keys (${versionState(model, variant.version)})`,
    ]);
  });
  if (policy.shadow !== undefined) {
    rows.push([
      'shadow',
      `${policy.shadow.version}: mirrors ${percent(policy.shadow.percent)} of requests (${versionState(model, policy.shadow.version)})`,
    ]);
  }
  if (policy.fallbackModel !== '') rows.push(['fallback', `model ${policy.fallbackModel}`]);
  const width = Math.max(...rows.map(([label]) => label.length));
  return `${header}:\n${rows.map(([label, text]) => `  ${label.padEnd(width)}  ${text}`).join('\n')}\n`;
}

export function formatCache(cache: CachePolicy | undefined): string {
  if (cache === undefined) return "router's defaults";
  if (cache.enabled === false) return 'off';
  const parts = ['on'];
  parts.push(cache.ttlMs > 0n ? `ttl ${cache.ttlMs} ms` : "router's default ttl");
  if (cache.maxEntryBytes > 0n) parts.push(`entries up to ${formatBytes(Number(cache.maxEntryBytes))}`);
  return parts.join(', ');
}

export function formatBatching(batching: Batching | undefined): string {
  if (batching === undefined) return 'defaults (up to the max batch size, no waiting while a worker is idle)';
  const parts: string[] = [];
  if (batching.maxBatchSize !== undefined)
    parts.push(batching.maxBatchSize === 0 ? 'off (one request per batch)' : `max batch ${batching.maxBatchSize}`);
  if (batching.maxQueueDelayUs !== undefined) parts.push(`max queue delay ${batching.maxQueueDelayUs} us`);
  if (batching.preferredBatchSizes.length > 0) parts.push(`preferred sizes ${batching.preferredBatchSizes.join(', ')}`);
  if (batching.preserveOrdering) parts.push('preserves ordering');
  if (batching.priorityLevels > 0) {
    parts.push(
      `${batching.priorityLevels} priority levels (default ${batching.defaultPriorityLevel === 0 ? 'the lowest' : batching.defaultPriorityLevel})`,
    );
  }
  if (batching.maxQueueSize > 0) parts.push(`queue up to ${batching.maxQueueSize} requests`);
  return parts.join(', ') || 'defaults';
}

/** The warm-up a version was registered with and, once READY, whether it was warmed up. */
export function formatWarmUp(version: ModelVersion): string {
  const samples = version.warmUp?.samples ?? [];
  const given =
    samples.length === 0
      ? 'synthetic (no samples given)'
      : `${samples.length} sample${samples.length === 1 ? '' : 's'} given (${samples.map((s, i) => (s.name === '' ? `sample ${i + 1}` : `"${s.name}"`)).join(', ')})`;
  if (version.state !== VersionState.READY) return given;
  return version.warmUpError === '' ? `${given}; warmed up` : `${given}; NOT warmed up: ${version.warmUpError}`;
}

export function formatProcessing(processing: Processing | undefined): string[] {
  if (processing === undefined) return ['none'];
  const lines = [
    ...processing.inputNormalizations.map(
      (n) => `input ${n.input}: (x - mean) / std, mean [${n.mean.join(', ') || '0'}], std [${n.std.join(', ') || '1'}]`,
    ),
    ...processing.outputLabels.map((l) => `output ${l.output}: ${l.labels.length} class labels`),
  ];
  return lines.length > 0 ? lines : ['none'];
}

function tensorRows(tensors: readonly TensorSpec[]): string[][] {
  return tensors.map((t) => [t.name, datatypeName(t.datatype), formatShape(t.shape)]);
}

function indent(text: string, by: string): string {
  return text
    .trimEnd()
    .split('\n')
    .map((line) => `${by}${line}`)
    .join('\n');
}

function formatVersion(version: ModelVersion): string {
  const lines = [
    `Version ${versionIdOf(version.name)}: ${stateName(version.state)}${version.stateReason === '' ? '' : ` (${version.stateReason})`}`,
  ];
  const signature = version.signature;
  if (signature !== undefined) {
    const headers = ['NAME', 'DATATYPE', 'SHAPE'];
    const tensors = (specs: readonly TensorSpec[]) =>
      specs.length === 0 ? '    none' : indent(table(headers, tensorRows(specs)), '    ');
    lines.push('  Inputs:', tensors(signature.inputs), '  Outputs:', tensors(signature.outputs));
    lines.push(`  Max batch size: ${signature.maxBatchSize === 0 ? '0 (does not batch)' : signature.maxBatchSize}`);
  }
  lines.push(`  Batching: ${formatBatching(version.batching)}`);
  lines.push(`  Warm-up: ${formatWarmUp(version)}`);
  const threads = version.execution?.intraOpThreads ?? 0;
  lines.push(`  Operator threads: ${threads === 0 ? "the worker's default" : `${threads} per instance`}`);
  const processing = formatProcessing(version.processing);
  lines.push(
    processing.length === 1
      ? `  Processing: ${processing[0]}`
      : `  Processing:\n${processing.map((p) => `    ${p}`).join('\n')}`,
  );
  if (version.artifact !== undefined) {
    lines.push(`  Artifact: sha256 ${version.artifact.sha256}, ${formatBytes(Number(version.artifact.sizeBytes))}`);
  }
  if (version.lineage !== undefined) lines.push(...formatLineage(version.lineage));
  return lines.join('\n');
}

/** ", and 12 more" when a lineage lists fewer nodes than it counts. */
function more(count: number, listed: number): string {
  return count > listed ? ` and ${count - listed} more` : '';
}

/** A derived version's lineage: where it comes from, how it was made, how close it is to its source. */
function formatLineage(lineage: Lineage): string[] {
  const settings = lineage.settings;
  const lines = [
    `  Derived from: ${lineage.sourceVersion} (sha256 ${lineage.sourceSha256})`,
    `  Method: ${lineage.method}, ${settings?.perChannel === false ? 'one scale per weight' : 'a scale per output channel'}${settings?.reduceRange === false ? ', 8-bit weights' : ', 7-bit weights'}, Conv ${settings?.quantizeConv === true ? 'quantized' : 'in float'}`,
    `  Quantized: ${lineage.quantizedNodes.map((n) => `${n.node} (${n.opType})`).join(', ') || 'none'}${more(lineage.quantizedNodeCount, lineage.quantizedNodes.length)}`,
  ];
  if (lineage.floatNodes.length > 0) {
    lines.push('  Kept in float:', ...lineage.floatNodes.map((n) => `    ${n.node} (${n.opType}): ${n.reason}`));
    const unlisted = more(lineage.floatNodeCount, lineage.floatNodes.length);
    if (unlisted !== '') lines.push(`   ${unlisted}`);
  }
  if (lineage.accuracy !== undefined)
    lines.push(`  Accuracy: ${describeAccuracy(lineage.accuracy)}; gate relative L2 ${lineage.accuracy.maxRelativeL2}`);
  return lines;
}

/** `infermesh models show`: the model's settings, its versions' states and each version's details. */
export function formatModelDetails(model: Model): string {
  const labels = Object.entries(model.labels)
    .sort(([a], [b]) => a.localeCompare(b))
    .map(([k, v]) => `${k}=${v}`)
    .join(', ');
  const settings: [string, string][] = [
    ['Model', modelIdOf(model.name)],
    ['Platform', model.platform || '-'],
    ['Pinned', yesNo(model.pinned)],
    ['Unloaded', model.unloaded ? 'yes (no version serves until `infermesh models load`)' : 'no'],
    ['Version policy', formatVersionPolicy(model.versionPolicy)],
    ['Serving', servingVersions(model).join(', ') || 'none'],
    ['Cache', formatCache(model.cache)],
    ['Labels', labels || 'none'],
  ];
  const width = Math.max(...settings.map(([k]) => k.length));
  const parts = [
    settings.map(([k, v]) => `${`${k}:`.padEnd(width + 1)}  ${v}`).join('\n'),
    '',
    formatRollout(model).trimEnd(),
    '',
  ];
  if (model.versions.length === 0) {
    parts.push('No versions.');
  } else {
    parts.push(
      table(
        ['VERSION', 'STATE', 'CREATED', 'REASON'],
        model.versions.map((v) => [
          versionIdOf(v.name),
          stateName(v.state),
          v.createTime === undefined ? '-' : timestampDate(v.createTime).toISOString(),
          v.stateReason !== ''
            ? v.stateReason
            : v.state === VersionState.READY && v.warmUpError !== ''
              ? 'not warmed up (see Warm-up)'
              : '',
        ]),
      ).trimEnd(),
    );
    for (const version of model.versions) {
      if (version.state !== VersionState.RETIRED) parts.push('', formatVersion(version));
    }
  }
  return `${parts.join('\n')}\n`;
}

/** infer, admin, infer+admin: the scopes as `--scope` and GATEWAY_API_KEYS name them. */
export function formatScopes(scopes: readonly Scope[]): string {
  return scopes.map((s) => (Scope[s] ?? `SCOPE_${s}`).toLowerCase()).join('+') || '-';
}

/** "0123456789ab" of "apiKeys/0123456789ab". */
export function apiKeyIdOf(key: Pick<ApiKey, 'name'>): string {
  return key.name.startsWith('apiKeys/') ? key.name.slice('apiKeys/'.length) : key.name;
}

const requestRate = (perS: number) => `${Number(perS.toPrecision(6))}/s`;

/** "5/s (burst 10), 2/s per model (burst 2)"; "gateway defaults" when the key has no limits of its own. */
export function formatRateLimit(limit: RateLimit | undefined): string {
  if (limit === undefined) return 'gateway defaults';
  const parts: string[] = [];
  if (limit.requestsPerSecond > 0) {
    parts.push(
      `${requestRate(limit.requestsPerSecond)} (burst ${limit.burst || Math.max(1, limit.requestsPerSecond)})`,
    );
  }
  if (limit.perModelRequestsPerSecond > 0) {
    parts.push(
      `${requestRate(limit.perModelRequestsPerSecond)} per model (burst ${limit.perModelBurst || Math.max(1, limit.perModelRequestsPerSecond)})`,
    );
  }
  return parts.join(', ') || 'none';
}

const timestamp = (time: ApiKey['createTime']) => (time === undefined ? '-' : timestampDate(time).toISOString());

/** `infermesh keys list`: every key with what it may do; revoked keys stay listed with the time of revocation. */
export function formatApiKeyList(keys: readonly ApiKey[]): string {
  if (keys.length === 0) return 'No API keys stored. Create one with `infermesh keys create`.\n';
  return table(
    ['ID', 'NAME', 'SCOPES', 'TENANT', 'MODELS', 'LIMITS', 'CREATED', 'REVOKED'],
    keys.map((k) => [
      apiKeyIdOf(k),
      k.displayName || '-',
      formatScopes(k.scopes),
      k.tenant || `key:${apiKeyIdOf(k)} (default)`,
      k.models.join(', ') || 'all',
      formatRateLimit(k.rateLimit),
      timestamp(k.createTime),
      timestamp(k.revokeTime),
    ]),
  );
}

/** One key in a sentence: "apiKeys/0123456789ab (checkout): scopes infer, tenant team-a, models mlp, limits 5/s (burst 5)". */
export function formatApiKey(key: ApiKey): string {
  const name = key.displayName === '' ? key.name : `${key.name} (${key.displayName})`;
  const tenant = key.tenant || `key:${apiKeyIdOf(key)}`;
  return `${name}: scopes ${formatScopes(key.scopes)}, tenant ${tenant}, models ${key.models.join(', ') || 'all'}, limits ${formatRateLimit(key.rateLimit)}`;
}
