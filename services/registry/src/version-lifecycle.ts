import { clone } from '@bufbuild/protobuf';
import { timestampDate, timestampFromDate } from '@bufbuild/protobuf/wkt';
import {
  type Model,
  ModelSchema,
  type ModelVersion,
  type VersionPolicy,
  VersionState,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { compareVersionIds, versionIdOf } from '@infermesh/rollout';

/** The version policy of a model that sets none: the latest version serves (Triton's default). */
export const DEFAULT_LATEST = 1;

/** The state_reason of a version RetireModelVersion drains: it never serves again. */
export const RETIRING_REASON = 'retired with RetireModelVersion, draining';
/** The state_reason of a version draining because its model's policies no longer select it. */
export const LEFT_SERVING_SET_REASON = 'left the serving set, draining';
/** The state_reason of a version draining because its model was unloaded. */
export const UNLOADED_REASON = 'the model is unloaded, draining';

/** "READY" for VersionState.READY. */
export function stateName(state: VersionState): string {
  return (VersionState[state] ?? String(state)).replace(/^VERSION_STATE_/, '');
}

/** A version that RetireModelVersion retired and that still drains. */
export function isRetiring(version: ModelVersion): boolean {
  return version.state === VersionState.DRAINING && version.stateReason === RETIRING_REASON;
}

/** A version that never serves again: RETIRED, or retired and still draining. */
export function hasEnded(version: ModelVersion): boolean {
  return version.state === VersionState.RETIRED || isRetiring(version);
}

/** "latest 1", "specific [1, 3]" or "all"; an unset policy is the default, latest 1. */
export function describeVersionPolicy(policy: VersionPolicy | undefined): string {
  const selection = policy?.policy;
  switch (selection?.case) {
    case undefined:
      return `latest ${DEFAULT_LATEST}`;
    case 'latest':
      return `latest ${selection.value}`;
    case 'specific':
      return `specific [${selection.value.versions.join(', ')}]`;
    case 'all':
      return 'all';
  }
}

/** The versions a model's rollout policy names, each with its role: "stable version", "canary", "variant" or "shadow". */
export function rolloutRoles(model: Model): Map<string, string> {
  const roles = new Map<string, string>();
  const rollout = model.rollout;
  if (rollout === undefined) return roles;
  if (rollout.stableVersion !== '') roles.set(rollout.stableVersion, 'stable version');
  if (rollout.canary !== undefined && rollout.canary.version !== '') roles.set(rollout.canary.version, 'canary');
  for (const variant of rollout.variants) if (variant.version !== '') roles.set(variant.version, 'variant');
  if (rollout.shadow !== undefined && rollout.shadow.version !== '') roles.set(rollout.shadow.version, 'shadow');
  return roles;
}

/**
 * The ids of the versions that may serve: those the version policy selects plus those the rollout
 * policy names, never a RETIRED (or retiring) one; none when the model is unloaded.
 * - `latest N`: the N highest versions that are READY, or DRAINING and so still loaded (they come back
 *   when a newer one fails or the model is loaded again within the drain grace period), plus every
 *   newer version still REGISTERED or LOADING: a new version loads while the old one serves, and the
 *   old one leaves only once the new one is READY.
 * - `specific`: the versions it names. `all`: every version.
 */
export function servingSet(model: Model): Set<string> {
  if (model.unloaded) return new Set();
  const live = model.versions.filter((v) => !hasEnded(v));
  const liveIds = new Set(live.map((v) => versionIdOf(v.name)));
  const serving = new Set([...rolloutRoles(model).keys()].filter((id) => liveIds.has(id)));
  const selection = model.versionPolicy?.policy;
  switch (selection?.case) {
    case 'all':
      for (const id of liveIds) serving.add(id);
      break;
    case 'specific':
      for (const id of selection.value.versions) if (liveIds.has(id)) serving.add(id);
      break;
    case 'latest':
    case undefined: {
      const count = Math.max(1, selection?.case === 'latest' ? selection.value : DEFAULT_LATEST);
      const loaded = live
        .filter((v) => v.state === VersionState.READY || v.state === VersionState.DRAINING)
        .map((v) => versionIdOf(v.name))
        .sort((a, b) => compareVersionIds(b, a));
      for (const id of loaded.slice(0, count)) serving.add(id);
      const highest = loaded[0];
      for (const version of live) {
        const id = versionIdOf(version.name);
        const pending = version.state === VersionState.REGISTERED || version.state === VersionState.LOADING;
        if (pending && (highest === undefined || compareVersionIds(id, highest) > 0)) serving.add(id);
      }
      break;
    }
  }
  return serving;
}

/** One state change the lifecycle made. */
export interface Transition {
  /** models/{model}/versions/{version} */
  version: string;
  from: VersionState;
  to: VersionState;
  reason: string;
}

/**
 * Brings a model's version states in line with its serving set, as of `now`:
 * - a version in the set that is DRAINING is READY again (it is still loaded);
 * - outside the set, READY becomes DRAINING (finishing its queued and in-flight requests, taking no
 *   new ones); LOADING and REGISTERED, which take no traffic, become RETIRED at once, or REGISTERED
 *   when the model is unloaded (loadable again); DRAINING becomes RETIRED once it has drained for
 *   `drainGraceMs` (REGISTERED when the model is unloaded, unless it was retired with
 *   RetireModelVersion); FAILED and RETIRED stay.
 * Pure: returns a new model (the same content when nothing changes) and the transitions made. Applying
 * it again at the same time changes nothing.
 */
export function applyLifecycle(
  model: Model,
  now: Date,
  drainGraceMs: number,
): { model: Model; transitions: Transition[] } {
  const next = clone(ModelSchema, model);
  const serving = servingSet(next);
  const transitions: Transition[] = [];
  const move = (version: ModelVersion, to: VersionState, reason: string) => {
    transitions.push({ version: version.name, from: version.state, to, reason });
    version.state = to;
    version.stateReason = reason;
    version.updateTime = timestampFromDate(now);
    // A version no worker keeps loaded any more has no ready workers; DRAINING ones are still loaded.
    if (to !== VersionState.READY && to !== VersionState.DRAINING) version.readyWorkerIds = [];
  };
  for (const version of next.versions) {
    if (serving.has(versionIdOf(version.name))) {
      if (version.state === VersionState.DRAINING) move(version, VersionState.READY, '');
      continue;
    }
    switch (version.state) {
      case VersionState.READY:
        move(version, VersionState.DRAINING, next.unloaded ? UNLOADED_REASON : LEFT_SERVING_SET_REASON);
        break;
      case VersionState.LOADING:
        move(version, next.unloaded ? VersionState.REGISTERED : VersionState.RETIRED, '');
        break;
      case VersionState.REGISTERED:
        if (!next.unloaded) move(version, VersionState.RETIRED, '');
        break;
      case VersionState.DRAINING:
        if (drainedBy(version, now, drainGraceMs))
          move(version, next.unloaded && !isRetiring(version) ? VersionState.REGISTERED : VersionState.RETIRED, '');
        break;
      case VersionState.FAILED:
      case VersionState.RETIRED:
      case VersionState.UNSPECIFIED:
        break;
    }
  }
  return { model: next, transitions };
}

/** Why a version takes traffic and cannot be retired now, or undefined when it does not. */
export function whyServing(model: Model, versionId: string): string | undefined {
  const role = rolloutRoles(model).get(versionId);
  if (role !== undefined) {
    return `the rollout policy names it as the ${role}; change the rollout first (SetRolloutPolicy or UpdateRollout)`;
  }
  const version = model.versions.find((v) => versionIdOf(v.name) === versionId);
  if (version?.state !== VersionState.READY || !servingSet(model).has(versionId)) return undefined;
  const policy = describeVersionPolicy(model.versionPolicy);
  const selection = model.versionPolicy?.policy;
  switch (selection?.case) {
    case undefined:
    case 'latest': {
      const count = selection?.case === 'latest' ? selection.value : DEFAULT_LATEST;
      const which = count === 1 ? 'the latest READY version' : `one of the ${count} latest READY versions`;
      return `it is ${which} under version policy ${policy}; register a newer version or change the version policy first`;
    }
    case 'specific':
    case 'all':
      return `version policy ${policy} selects it; change the version policy first`;
  }
}

/** Whether a DRAINING version has drained for the grace period by `now`. */
function drainedBy(version: ModelVersion, now: Date, drainGraceMs: number): boolean {
  const since = version.updateTime === undefined ? 0 : timestampDate(version.updateTime).getTime();
  return now.getTime() - since >= drainGraceMs;
}
