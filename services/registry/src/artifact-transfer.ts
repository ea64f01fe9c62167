import { create } from '@bufbuild/protobuf';
import { Inject, Injectable } from '@nestjs/common';
import { RpcError, Errors } from '@infermesh/grpc';
import {
  type Artifact,
  ArtifactSchema,
  type UploadArtifactRequest,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { JsonLogger, Metrics } from '@infermesh/telemetry';
import type { Counter } from 'prom-client';
import { ArtifactDigestMismatchError, ArtifactStore, ArtifactTooLargeError, SHA256_HEX } from './artifact-store';
import { readOnnxSignature } from './onnx-signature';
import { OnnxRuntime } from './onnx-runtime.adapter';
import { REGISTRY_CONFIG, type RegistryConfig } from './registry.config';

type UploadOutcome = 'stored' | 'deduplicated' | 'too_large' | 'digest_mismatch' | 'invalid' | 'cancelled' | 'error';

/** The registry's use cases on artifacts: stream them in and out of the content-addressed store. */
@Injectable()
export class ArtifactTransfer {
  private readonly uploads: Counter<'outcome'>;
  private readonly storedBytes: Counter;

  constructor(
    private readonly artifacts: ArtifactStore,
    private readonly onnx: OnnxRuntime,
    @Inject(REGISTRY_CONFIG) private readonly config: RegistryConfig,
    private readonly logger: JsonLogger,
    metrics: Metrics,
  ) {
    this.uploads = metrics.counter(
      'artifact_uploads_total',
      'Artifact uploads by outcome (stored, deduplicated, too_large, digest_mismatch, invalid, cancelled, error).',
      ['outcome'],
    );
    this.storedBytes = metrics.counter(
      'artifact_stored_bytes_total',
      'Bytes of new artifacts written to the artifact store (deduplicated uploads excluded).',
    );
  }

  /**
   * Stores the chunks of an upload under their SHA-256. The expected_sha256 may come with any message.
   * The bytes must be an ONNX model that onnxruntime can load. A mismatch, an upload over the size
   * limit (refused as soon as it passes it), bytes that are not a loadable ONNX model, or a cancelled
   * upload store nothing.
   */
  async upload(requests: AsyncIterable<UploadArtifactRequest>, signal: AbortSignal): Promise<Artifact> {
    let expected: string | undefined;
    async function* chunks(): AsyncGenerator<Uint8Array> {
      for await (const request of requests) {
        if (request.expectedSha256 !== '') {
          const given = request.expectedSha256.toLowerCase();
          if (!SHA256_HEX.test(given)) {
            throw Errors.invalidRequest(
              `expected_sha256 must be 64 hexadecimal digits, got "${request.expectedSha256}"`,
            );
          }
          if (expected !== undefined && expected !== given) {
            throw Errors.invalidRequest(`expected_sha256 changed during the upload, from ${expected} to ${given}`);
          }
          expected = given;
        }
        if (request.chunk.byteLength > 0) yield request.chunk;
      }
    }
    let outcome: UploadOutcome = 'error';
    try {
      // A client that cancels can end the request stream as if it had finished: the store checks the
      // call's signal once more before it commits, so a truncated upload is never stored.
      const stored = await this.artifacts.write(chunks(), {
        maxBytes: this.config.maxArtifactBytes,
        expectedSha256: () => expected,
        signal,
        check: (bytes) => this.checkModel(bytes),
      });
      outcome = stored.created ? 'stored' : 'deduplicated';
      if (stored.created) {
        this.storedBytes.inc(stored.sizeBytes);
        this.logger.info('artifact stored', { sha256: stored.sha256, size_bytes: stored.sizeBytes });
      }
      return create(ArtifactSchema, { sha256: stored.sha256, sizeBytes: BigInt(stored.sizeBytes), format: 'onnx' });
    } catch (error) {
      if (error instanceof ArtifactTooLargeError) {
        outcome = 'too_large';
        throw Errors.invalidArtifact(
          `the artifact is larger than the registry's limit of ${error.maxBytes} bytes (REGISTRY_MAX_ARTIFACT_BYTES); nothing was stored`,
          { metadata: { maxBytes: String(error.maxBytes) } },
        );
      }
      if (error instanceof ArtifactDigestMismatchError) {
        outcome = 'digest_mismatch';
        throw Errors.invalidArtifact(
          `the uploaded bytes hash to ${error.actualSha256}, not the expected_sha256 ${error.expectedSha256}; nothing was stored`,
          { metadata: { expectedSha256: error.expectedSha256, actualSha256: error.actualSha256 } },
        );
      }
      if (signal.aborted) {
        outcome = 'cancelled';
        throw Errors.cancelled('the upload was cancelled; nothing was stored');
      }
      if (error instanceof RpcError) outcome = 'invalid';
      throw error;
    } finally {
      this.uploads.inc({ outcome });
    }
  }

  /** Refuses bytes that are not an ONNX model with a signature the registry can serve, or that onnxruntime cannot load. */
  private async checkModel(bytes: Buffer): Promise<void> {
    readOnnxSignature(bytes);
    try {
      await this.onnx.load(bytes);
    } catch (error) {
      const reason = (error instanceof Error ? error.message : String(error)).trim();
      throw Errors.invalidArtifact(`onnxruntime cannot load the artifact: ${reason}; nothing was stored`);
    }
  }

  /** The artifact's bytes in chunks no larger than the download chunk size. */
  async *download(sha256: string): AsyncGenerator<Uint8Array> {
    const address = sha256.toLowerCase();
    if (!SHA256_HEX.test(address)) throw Errors.invalidRequest(`sha256 must be 64 hexadecimal digits, got "${sha256}"`);
    const chunks = await this.artifacts.read(address, this.config.downloadChunkBytes);
    if (chunks === undefined)
      throw Errors.artifactNotFound(`artifact ${address} not found`, { metadata: { sha256: address } });
    yield* chunks;
  }
}
