import { createHash, type Hash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { stat } from 'node:fs/promises';
import { basename } from 'node:path';
import { status } from '@grpc/grpc-js';
import type { MessageInitShape } from '@bufbuild/protobuf';
import { RpcError } from '@infermesh/grpc';
import {
  type ExecutionSchema,
  type Model,
  type ModelVersion,
  ModelVersionSchema,
  type UploadArtifactRequestSchema,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { nextVersionId } from '@infermesh/rollout';
import { type FlagSpec, type ParsedArgs, parseInteger } from './args';
import { CommandFailure } from './cli-errors';
import type { CommandContext } from './command-context';
import type { GatewaySession } from './gateway-session';
import { formatBytes, formatSeconds, stateName } from './output/format';
import { ProgressBar, type ProgressMode } from './progress-bar';
import { waitForReady } from './version-watch';
import { readWarmUpFile } from './warm-up-file';

/** `--intra-op-threads`, of `models register` and `models quantize`: how the workers run the version. */
export const INTRA_OP_THREADS_FLAG: FlagSpec = {
  name: 'intra-op-threads',
  kind: 'value',
  placeholder: '<n>',
  description:
    "Operator threads of each instance of the version (default: the worker's WORKER_INTRA_OP_THREADS); small and int8 models run nearly as fast on 1, at less CPU",
};

/** The execution `--intra-op-threads` asks for; undefined when it is not given. */
export function executionOf(args: ParsedArgs): MessageInitShape<typeof ExecutionSchema> | undefined {
  const threads = args.value(INTRA_OP_THREADS_FLAG.name);
  return threads === undefined ? undefined : { intraOpThreads: parseInteger(threads, '--intra-op-threads', 1) };
}

/** The size of the chunks an artifact is uploaded in. */
export const UPLOAD_CHUNK_BYTES = 1024 * 1024;
/** CreateModelVersion reads the whole artifact to find its signature: it may take a while. */
const CREATE_TIMEOUT_MS = 120_000;

export interface RegisterRequest {
  file: string;
  model: string;
  /** Unset: one more than the model's highest version id, 1 for a new model. */
  versionId: string | undefined;
  maxBatchSize: number | undefined;
  pin: boolean;
  /** Added to the model's labels (a key given again takes the new value). */
  labels: Readonly<Record<string, string>>;
  timeoutMs: number;
  /** A warm-up file (readWarmUpFile): what the workers run the version on before it serves. */
  warmUpFile: string | undefined;
  /** How the workers run the version; unset: their defaults. */
  execution?: MessageInitShape<typeof ExecutionSchema>;
}

/**
 * `infermesh models register`: streams the file to UploadArtifact in 1 MiB chunks while hashing it,
 * sends the SHA-256 with the last message (the registry checks it), registers the version, pins and
 * labels the model when asked, then follows the registry until the version is READY.
 */
export async function registerModel(ctx: CommandContext, request: RegisterRequest): Promise<void> {
  const started = ctx.clock.monotonic();
  const sizeBytes = await fileSize(request.file);
  // Read before anything is uploaded, so that a bad file costs nothing.
  const warmUp = request.warmUpFile === undefined ? undefined : await readWarmUpFile(request.warmUpFile);
  const session = ctx.gateway();
  const parent = `models/${request.model}`;
  const existing = await getModelIfAny(session, parent);
  const versionId = request.versionId ?? nextVersionId(existing);

  const mode: ProgressMode = ctx.json ? 'off' : ctx.io.stderr.isTTY === true ? 'bar' : 'lines';
  const progress = new ProgressBar(ctx.io.stderr, {
    label: `Uploading ${basename(request.file)}`,
    totalBytes: sizeBytes,
    mode,
  });
  const hash = createHash('sha256');
  let sha256: string;
  try {
    const { artifact } = await session.registry.uploadArtifact(
      uploadRequests(request.file, hash, progress),
      session.stream(),
    );
    sha256 = hash.digest('hex');
    if (artifact !== undefined && artifact.sha256 !== sha256) {
      throw new CommandFailure(
        `the registry stored ${request.file} as sha256 ${artifact.sha256}, but the file hashes to ${sha256}`,
      );
    }
  } finally {
    progress.finish();
  }
  const uploadedMs = ctx.clock.monotonic() - started;

  const { version } = await session.registry.createModelVersion(
    {
      parent,
      versionId,
      artifactSha256: sha256,
      ...(request.maxBatchSize !== undefined && { maxBatchSize: request.maxBatchSize }),
      ...(warmUp !== undefined && { warmUp }),
      ...(request.execution !== undefined && { execution: request.execution }),
    },
    session.call(CREATE_TIMEOUT_MS),
  );
  const versionName = version?.name ?? `${parent}/versions/${versionId}`;
  ctx.note(`Registered ${request.model} version ${versionId} (sha256 ${sha256}, ${formatBytes(sizeBytes)})\n`);

  const paths = [...(request.pin ? ['pinned'] : []), ...(Object.keys(request.labels).length > 0 ? ['labels'] : [])];
  if (paths.length > 0) {
    await session.registry.updateModel(
      {
        model: { name: parent, pinned: request.pin, labels: { ...existing?.labels, ...request.labels } },
        updateMask: { paths },
      },
      session.call(),
    );
  }

  const ready = await followUntilReady(
    ctx,
    session,
    versionName,
    `${request.model} version ${versionId}`,
    request.timeoutMs,
  );
  const totalMs = ctx.clock.monotonic() - started;
  if (ready.warmUpError !== '') {
    ctx.note(`warning: ${request.model} version ${versionId} serves without warm-up: ${ready.warmUpError}\n`);
  }
  ctx.result(
    ModelVersionSchema,
    ready,
    () =>
      `${request.model} version ${versionId} is READY${ready.warmUpError === '' ? '' : ' (not warmed up)'} in ${formatSeconds(totalMs)} ` +
      `(upload ${formatSeconds(uploadedMs)}, registration and loading ${formatSeconds(totalMs - uploadedMs)})\n`,
  );
}

async function fileSize(file: string): Promise<number> {
  try {
    const info = await stat(file);
    if (!info.isFile()) throw new CommandFailure(`${file} is not a file`);
    return info.size;
  } catch (error) {
    if (error instanceof CommandFailure) throw error;
    const code = (error as NodeJS.ErrnoException).code;
    throw new CommandFailure(
      `cannot read ${file}: ${code === 'ENOENT' ? 'no such file' : error instanceof Error ? error.message : String(error)}`,
    );
  }
}

async function getModelIfAny(session: GatewaySession, name: string): Promise<Model | undefined> {
  try {
    return (await session.registry.getModel({ name }, session.call())).model;
  } catch (error) {
    if (error instanceof RpcError && error.code === status.NOT_FOUND) return undefined;
    throw error;
  }
}

async function* uploadRequests(
  file: string,
  hash: Hash,
  progress: ProgressBar,
): AsyncGenerator<MessageInitShape<typeof UploadArtifactRequestSchema>> {
  let sent = 0;
  for await (const chunk of createReadStream(file, { highWaterMark: UPLOAD_CHUNK_BYTES }) as AsyncIterable<Buffer>) {
    hash.update(chunk);
    yield { chunk };
    // The generator resumes once the call has taken the chunk.
    sent += chunk.byteLength;
    progress.update(sent);
  }
  // The registry checks the bytes it received against the hash, which is known only now.
  yield { expectedSha256: hash.copy().digest('hex') };
}

/** Follows a version until it is READY, showing the states it goes through (StateTrail); see waitForReady for how it fails. */
export async function followUntilReady(
  ctx: CommandContext,
  session: GatewaySession,
  versionName: string,
  label: string,
  timeoutMs: number,
): Promise<ModelVersion> {
  const trail = new StateTrail(ctx, label);
  try {
    return await waitForReady(session, versionName, { timeoutMs, clock: ctx.clock, onState: (v) => trail.show(v) });
  } finally {
    trail.end();
  }
}

/**
 * The states a version goes through while the CLI waits: on a terminal one line that grows
 * (REGISTERED → LOADING → READY), elsewhere a line per state; nothing with --json.
 */
class StateTrail {
  private shown = 0;

  constructor(
    private readonly ctx: CommandContext,
    private readonly label: string,
  ) {}

  show(version: ModelVersion): void {
    const state = stateName(version.state);
    if (this.ctx.io.stderr.isTTY !== true) this.ctx.note(`${this.label}: ${state}\n`);
    else this.ctx.note(this.shown === 0 ? `${this.label}: ${state}` : ` → ${state}`);
    this.shown++;
  }

  end(): void {
    if (this.ctx.io.stderr.isTTY === true && this.shown > 0) this.ctx.note('\n');
  }
}
