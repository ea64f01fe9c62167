import { createHash } from 'node:crypto';
import { type Model, type ModelVersion, VersionState } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { versionIdOf } from './resource-names';

/** Orders version ids numerically, oldest first. */
export function compareVersionIds(a: string, b: string): number {
  return Number(a) - Number(b);
}

/** The id a new version of `model` takes by default: one above its highest version id; 1 for a model that does not exist yet. */
export function nextVersionId(model: Model | undefined): string {
  const ids = (model?.versions ?? []).map((v) => versionIdOf(v.name)).sort(compareVersionIds);
  const highest = ids[ids.length - 1];
  return highest === undefined ? '1' : String(BigInt(highest) + 1n);
}

/** The highest-numbered READY version of a model, or undefined when none is READY. */
export function latestReady(model: Model): ModelVersion | undefined {
  let latest: ModelVersion | undefined;
  for (const version of model.versions) {
    if (version.state !== VersionState.READY) continue;
    if (latest === undefined || compareVersionIds(versionIdOf(version.name), versionIdOf(latest.name)) > 0)
      latest = version;
  }
  return latest;
}

/** The version that takes what a rollout leaves: its stable version when READY, else the latest READY one. */
export function stableVersion(model: Model): ModelVersion | undefined {
  return readyVersion(model, model.rollout?.stableVersion ?? '') ?? latestReady(model);
}

/**
 * Where a routing key falls in [0, 100): a hash of the model and the key, so that a key keeps its
 * place as a policy's shares change, and different models spread keys independently.
 */
export function stickyBucket(model: string, routingKey: string): number {
  const digest = createHash('sha256').update(model).update('\u0000').update(routingKey).digest();
  return (digest.readUInt32BE(0) / 2 ** 32) * 100;
}

export type RouteKind = 'canary' | 'variant' | 'stable';

export interface Route {
  version: ModelVersion;
  kind: RouteKind;
}

/**
 * The version that serves a request naming no version, under the model's rollout policy: the canary
 * when a random draw falls in its share, else the variant whose share holds the routing key's bucket
 * (a request without a routing key is placed at random), else the stable version. A chosen version
 * that is not READY passes the request on in that order. Undefined when no version is READY.
 */
export function route(model: Model, routingKey: string, random: () => number = Math.random): Route | undefined {
  const policy = model.rollout;
  if (policy !== undefined) {
    const canary = policy.canary;
    if (canary !== undefined && canary.percent > 0 && random() * 100 < canary.percent) {
      const version = readyVersion(model, canary.version);
      if (version !== undefined) return { version, kind: 'canary' };
    }
    if (policy.variants.length > 0) {
      const bucket = routingKey !== '' ? stickyBucket(model.name, routingKey) : random() * 100;
      let upTo = 0;
      for (const variant of policy.variants) {
        upTo += variant.percent;
        if (bucket < upTo) {
          const version = readyVersion(model, variant.version);
          if (version !== undefined) return { version, kind: 'variant' };
          break;
        }
      }
    }
  }
  const version = stableVersion(model);
  return version === undefined ? undefined : { version, kind: 'stable' };
}

/**
 * The version that mirrors a request the policy routed to `served`: its shadow, for a random share of
 * requests, when it is READY and is not the version that served.
 */
export function shadowOf(
  model: Model,
  served: ModelVersion,
  random: () => number = Math.random,
): ModelVersion | undefined {
  const shadow = model.rollout?.shadow;
  if (shadow === undefined || !(shadow.percent > 0) || random() * 100 >= shadow.percent) return undefined;
  const version = readyVersion(model, shadow.version);
  return version === undefined || version.name === served.name ? undefined : version;
}

function readyVersion(model: Model, versionId: string): ModelVersion | undefined {
  if (versionId === '') return undefined;
  const version = model.versions.find((v) => versionIdOf(v.name) === versionId);
  return version?.state === VersionState.READY ? version : undefined;
}
