import type { MessageInitShape } from '@bufbuild/protobuf';
import { type Clock, systemClock } from '@infermesh/clock';
import { createHash } from 'node:crypto';
import type { ServiceClient } from '@infermesh/grpc';
import {
  type BatchingSchema,
  type ModelVersion,
  type ProcessingSchema,
  type RegistryService,
  VersionState,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';

const CHUNK_BYTES = 1024 * 1024;

async function* chunks(bytes: Uint8Array, expectedSha256: string) {
  for (let offset = 0; offset < bytes.byteLength; offset += CHUNK_BYTES) {
    yield { chunk: bytes.subarray(offset, offset + CHUNK_BYTES), expectedSha256: offset === 0 ? expectedSha256 : '' };
  }
}

/**
 * Uploads an ONNX file and registers it as a model version with its pre- and post-processing and its
 * batching, when given (idempotent for the same bytes, processing and batching).
 */
export async function registerModel(
  registry: ServiceClient<typeof RegistryService>,
  name: string,
  versionId: string,
  bytes: Uint8Array,
  processing?: MessageInitShape<typeof ProcessingSchema>,
  batching?: MessageInitShape<typeof BatchingSchema>,
): Promise<ModelVersion> {
  const sha256 = createHash('sha256').update(bytes).digest('hex');
  const { artifact } = await registry.uploadArtifact(chunks(bytes, sha256), { timeoutMs: 120_000 });
  const { version } = await registry.createModelVersion(
    {
      parent: `models/${name}`,
      versionId,
      artifactSha256: artifact?.sha256 ?? sha256,
      ...(processing !== undefined && { processing }),
      ...(batching !== undefined && { batching }),
    },
    { timeoutMs: 60_000 },
  );
  if (version === undefined) throw new Error(`registry returned no version for models/${name}`);
  return version;
}

/** Waits `ms` on the clock between two looks at a system starting; the wait keeps the process alive. */
export function pause(clock: Clock, ms: number): Promise<void> {
  return new Promise((resolve) => clock.setTimer(resolve, ms, { keepAlive: true }));
}

/** Waits until every named version is READY; fails early when one is FAILED. */
export async function waitForVersionsReady(
  registry: ServiceClient<typeof RegistryService>,
  names: readonly string[],
  timeoutMs: number,
  clock: Clock = systemClock,
): Promise<void> {
  const deadline = clock.monotonic() + timeoutMs;
  for (;;) {
    const { models } = await registry.listModels({}, { timeoutMs: 5_000 });
    const versions = new Map(models.flatMap((m) => m.versions).map((v) => [v.name, v]));
    const pending: string[] = [];
    for (const name of names) {
      const version = versions.get(name);
      if (version?.state === VersionState.FAILED) throw new Error(`${name} failed to load: ${version.stateReason}`);
      if (version?.state !== VersionState.READY) pending.push(name);
    }
    if (pending.length === 0) return;
    if (clock.monotonic() > deadline) throw new Error(`not READY after ${timeoutMs} ms: ${pending.join(', ')}`);
    await pause(clock, 200);
  }
}
