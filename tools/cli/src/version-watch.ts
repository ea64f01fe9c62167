import type { Clock } from '@infermesh/clock';
import { RpcError } from '@infermesh/grpc';
import { type ModelVersion, VersionState } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { modelIdOf, modelNameOf, versionIdOf } from '@infermesh/rollout';
import { CommandFailure } from './cli-errors';
import type { GatewaySession } from './gateway-session';
import { formatSeconds, stateName } from './output/format';

export interface WaitForReadyOptions {
  timeoutMs: number;
  /** What `timeoutMs` is measured on. */
  clock: Clock;
  /** Called with the version when it is first seen and each time its state changes. */
  onState?: (version: ModelVersion) => void;
}

/**
 * Follows the registry (WatchModels) until a version is READY and returns it. Fails with a
 * CommandFailure, naming the version, when it becomes FAILED (with the reason), leaves the serving set
 * (DRAINING, RETIRED) before it was READY, when its model is deleted or unloaded, when the gateway
 * ends the watch, or when `timeoutMs` pass.
 */
export async function waitForReady(
  session: GatewaySession,
  versionName: string,
  options: WaitForReadyOptions,
): Promise<ModelVersion> {
  const modelName = modelNameOf(versionName);
  const modelId = modelIdOf(modelName);
  const label = `${modelId} version ${versionIdOf(versionName)}`;
  const controller = new AbortController();
  let timedOut = false;
  const cancelTimer = options.clock.setTimer(() => {
    timedOut = true;
    controller.abort();
  }, options.timeoutMs);
  let last: ModelVersion | undefined;
  try {
    for await (const change of session.registry.watchModels({ fromRevision: 0n }, session.stream(controller.signal))) {
      const model = change.models.find((m) => m.name === modelName);
      if (change.deleted.includes(modelName) || (change.snapshot && model === undefined)) {
        throw new CommandFailure(`model ${modelId} was deleted while waiting for ${label} to be READY`);
      }
      const version = model?.versions.find((v) => v.name === versionName);
      if (model === undefined || version === undefined) continue;
      if (last?.state !== version.state) options.onState?.(version);
      last = version;
      switch (version.state) {
        case VersionState.READY:
          return version;
        case VersionState.FAILED:
          throw new CommandFailure(`${label} FAILED: ${version.stateReason || 'the registry gives no reason'}`);
        case VersionState.DRAINING:
        case VersionState.RETIRED:
          throw new CommandFailure(
            `${label} is ${stateName(version.state)} without having been READY: the model's version policy and rollout no longer select it`,
          );
        case VersionState.UNSPECIFIED:
        case VersionState.REGISTERED:
        case VersionState.LOADING:
          if (model.unloaded) {
            throw new CommandFailure(
              `model ${modelId} is unloaded, so ${label} does not load: run \`infermesh models load ${modelId}\``,
            );
          }
          break;
      }
    }
    throw new CommandFailure(`the gateway ended the watch before ${label} was READY`);
  } catch (error) {
    if (timedOut && error instanceof RpcError) {
      const state = last === undefined ? 'not seen yet' : `still ${stateName(last.state)}`;
      throw new CommandFailure(
        `${label} is not READY after ${formatSeconds(options.timeoutMs)} (${state}); it may still load: follow it with \`infermesh models show ${modelId}\``,
      );
    }
    throw error;
  } finally {
    cancelTimer();
  }
}
