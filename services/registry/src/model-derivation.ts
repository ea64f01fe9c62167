import { create, equals } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import { Inject, Injectable } from '@nestjs/common';
import { RpcError, Errors } from '@infermesh/grpc';
import {
  DEFAULT_QUANTIZED_OPS,
  describeAccuracy,
  type DynamicQuantizationResult,
  QuantizationError,
  quantizeDynamic,
} from '@infermesh/quantization';
import {
  type Tensor,
  type TensorSpec,
  TensorSpecSchema,
} from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import {
  AccuracyReportSchema,
  type Lineage,
  LineageSchema,
  type Model,
  type ModelVersion,
  type QuantizeModelVersionRequest,
  type Signature,
  type WarmUpSample,
  WarmUpSampleSchema,
  WarmUpSchema,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { checkVersionId, nextVersionId, splitVersionName, stableVersion, versionIdOf } from '@infermesh/rollout';
import {
  addComparisons,
  type Comparison,
  compareOutputs,
  DataType,
  elementCount,
  sampleInputs,
} from '@infermesh/tensors';
import { JsonLogger, Metrics } from '@infermesh/telemetry';
import type { Counter } from 'prom-client';
import { ArtifactStore, chunksOf } from './artifact-store';
import { checkExecution } from './execution-check';
import { ModelCatalog } from './model-catalog';
import { OnnxRuntime, type OnnxSession } from './onnx-runtime.adapter';
import { readOnnxSignature } from './onnx-signature';
import { REGISTRY_CONFIG, type RegistryConfig } from './registry.config';
import { parseModelName } from './resource-name-check';
import { checkWarmUp, sampleLabel } from './warm-up-check';

/** The gate when the request sets none: 2 % relative L2 error. */
export const DEFAULT_MAX_RELATIVE_L2 = 0.02;
/** Synthetic calibration: this many samples of random inputs... */
export const SYNTHETIC_CALIBRATION_SAMPLES = 4;
/** ...each of this many items, for a model that batches. */
export const SYNTHETIC_CALIBRATION_BATCH = 8;
export const QUANTIZATION_METHOD = 'dynamic_int8';
/** The most nodes a lineage lists of each kind (it travels with the version to every follower); the counts are whole. */
export const MAX_LINEAGE_NODES = 64;
/**
 * The most input elements of all calibration samples together (64 MiB of FP32): each sample's
 * tensors are made when it runs, but a derivation is the control plane's work and stays bounded.
 */
export const MAX_CALIBRATION_ELEMENTS = 16_777_216;

type DerivationOutcome =
  'registered' | 'refused_accuracy' | 'refused_busy' | 'not_quantizable' | 'invalid' | 'cancelled' | 'error';

/** How a refused derivation is counted: by its reason, else by its code. */
function outcomeOf(error: RpcError): DerivationOutcome {
  if (error.reason === 'ACCURACY_GATE') return 'refused_accuracy';
  if (error.reason === 'NOT_QUANTIZABLE') return 'not_quantizable';
  if (error.code === status.CANCELLED) return 'cancelled';
  if (error.code === status.INTERNAL || error.code === status.UNKNOWN || error.code === status.UNAVAILABLE)
    return 'error';
  return 'invalid';
}

/**
 * The registry's use case of deriving versions from others: an int8 variant of a version by dynamic
 * quantization, registered with its lineage once it has passed an accuracy gate. The work is the
 * registry's, not the client's, so that the figures the version records are the registry's own: it
 * reads the source's artifact from its store, quantizes it (libs/quantization's quantizeDynamic),
 * loads the result as a worker would, runs both on the calibration inputs, and stores the variant
 * only when its error is within the gate.
 */
@Injectable()
export class ModelDerivation {
  private readonly derivations: Counter<'method' | 'outcome'>;
  /** The derivation in progress, which the next one waits for. */
  private previous: Promise<unknown> = Promise.resolve();
  /** Derivations running or waiting. */
  private waiting = 0;

  constructor(
    private readonly catalog: ModelCatalog,
    private readonly artifacts: ArtifactStore,
    private readonly onnx: OnnxRuntime,
    @Inject(REGISTRY_CONFIG) private readonly config: RegistryConfig,
    private readonly logger: JsonLogger,
    metrics: Metrics,
  ) {
    this.derivations = metrics.counter(
      'version_derivations_total',
      'Versions derived from others (QuantizeModelVersion), by method and outcome (registered, refused_accuracy, refused_busy, not_quantizable, invalid, cancelled, error).',
      ['method', 'outcome'],
    );
  }

  /**
   * Derives and registers an int8 variant. Derivations run one at a time on a registry (each holds
   * two models' sessions and the variant's bytes): a request waits for the ones before it, and is
   * refused with RESOURCE_EXHAUSTED when REGISTRY_MAX_QUEUED_DERIVATIONS already wait. A caller
   * that goes away (its `signal`) stops its derivation at the next step; nothing is registered after.
   */
  async quantize(request: QuantizeModelVersionRequest, signal?: AbortSignal): Promise<ModelVersion> {
    if (this.waiting >= this.config.maxQueuedDerivations + 1) {
      this.derivations.inc({ method: QUANTIZATION_METHOD, outcome: 'refused_busy' });
      throw Errors.overloaded(
        `the registry already runs a derivation and has ${this.config.maxQueuedDerivations} waiting (REGISTRY_MAX_QUEUED_DERIVATIONS); try again later`,
        { retryDelayMs: 5_000 },
      );
    }
    this.waiting += 1;
    const turn = this.previous.then(() => this.quantizeNow(request, signal));
    this.previous = turn.catch(() => undefined);
    try {
      return await turn;
    } finally {
      this.waiting -= 1;
    }
  }

  private async quantizeNow(
    request: QuantizeModelVersionRequest,
    signal: AbortSignal | undefined,
  ): Promise<ModelVersion> {
    let outcome: DerivationOutcome = 'error';
    try {
      const version = await this.derive(request, () => {
        if (signal?.aborted === true) throw Errors.cancelled('the caller went away; nothing was registered');
      });
      outcome = 'registered';
      return version;
    } catch (error) {
      if (error instanceof RpcError) outcome = outcomeOf(error);
      throw error;
    } finally {
      this.derivations.inc({ method: QUANTIZATION_METHOD, outcome });
    }
  }

  /** `stillWanted` throws when the caller has gone away: checked before each costly step. */
  private async derive(request: QuantizeModelVersionRequest, stillWanted: () => void): Promise<ModelVersion> {
    stillWanted();
    const maxRelativeL2 = request.maxRelativeL2 ?? DEFAULT_MAX_RELATIVE_L2;
    if (!Number.isFinite(maxRelativeL2) || maxRelativeL2 < 0) {
      throw Errors.invalidRequest(`max_relative_l2 must be a number 0 or more, got ${maxRelativeL2}`);
    }
    const perChannel = request.settings?.perChannel ?? true;
    const quantizeConv = request.settings?.quantizeConv ?? false;
    const reduceRange = request.settings?.reduceRange ?? true;
    checkExecution(request.execution);
    const source = await this.source(request.source);
    const signature = source.signature!;
    const sourceModelId = splitVersionName(source.name)!.modelId;
    const targetModelId =
      request.targetModel === '' ? sourceModelId : parseModelName(request.targetModel, 'target_model');
    const calibration = this.calibration(request.calibration, signature);
    const target = await this.modelIfAny(targetModelId);
    const versionId = request.versionId !== '' ? checkVersionId(request.versionId) : nextVersionId(target);
    // Refused before any work.
    if (target?.versions.some((v) => versionIdOf(v.name) === versionId) === true) {
      throw Errors.alreadyExists(
        `models/${targetModelId}/versions/${versionId} already exists; name another version or model`,
        { metadata: { version: `models/${targetModelId}/versions/${versionId}` } },
      );
    }
    const sourceBytes = Number(source.artifact!.sizeBytes);
    if (sourceBytes > this.config.maxDerivationBytes) {
      throw Errors.notQuantizable(
        `${source.name} is ${sourceBytes} bytes, above the ${this.config.maxDerivationBytes} the registry derives from (REGISTRY_MAX_DERIVATION_BYTES; a derivation holds about five times its source)`,
      );
    }
    stillWanted();

    const sourceSha256 = source.artifact!.sha256;
    const bytes = await this.artifacts.readAll(sourceSha256);
    if (bytes === undefined)
      throw Errors.artifactNotFound(`the artifact ${sourceSha256} of ${source.name} is missing from the store`);
    let variant: DynamicQuantizationResult;
    try {
      variant = quantizeDynamic(bytes, {
        perChannel,
        reduceRange,
        ops: quantizeConv ? [...DEFAULT_QUANTIZED_OPS, 'Conv'] : DEFAULT_QUANTIZED_OPS,
      });
    } catch (error) {
      if (!(error instanceof QuantizationError)) throw error;
      throw Errors.notQuantizable(`${source.name} cannot be quantized: ${error.message}`);
    }
    await this.checkLoads(variant.bytes, source, signature);
    stillWanted();

    const accuracy = await this.compare(bytes, variant.bytes, calibration, signature, source.name, stillWanted);
    const report = create(AccuracyReportSchema, {
      samples: calibration.samples.length,
      synthetic: calibration.synthetic,
      maxAbsDiff: accuracy.maxAbsDiff,
      relativeL2: accuracy.relativeL2,
      comparedItems: accuracy.topRows,
      agreedItems: accuracy.topAgreed,
      maxRelativeL2,
    });
    if (!(accuracy.relativeL2 <= maxRelativeL2)) {
      throw Errors.accuracyGate(
        `the int8 variant of ${source.name} is refused: its error is above the gate of relative L2 ${maxRelativeL2} (${describeAccuracy(report)}); nothing was registered`,
        {
          metadata: {
            source: source.name,
            relative_l2: String(accuracy.relativeL2),
            max_abs_diff: String(accuracy.maxAbsDiff),
            top1_agreement: accuracy.topRows === 0 ? '' : String(accuracy.topAgreed / accuracy.topRows),
            max_relative_l2: String(maxRelativeL2),
          },
        },
      );
    }

    stillWanted();
    const stored = await this.artifacts.write(chunksOf(variant.bytes), { maxBytes: this.config.maxArtifactBytes });
    const lineage: Lineage = create(LineageSchema, {
      sourceVersion: source.name,
      sourceSha256,
      method: QUANTIZATION_METHOD,
      settings: { perChannel, quantizeConv, reduceRange },
      quantizedNodes: variant.quantized
        .slice(0, MAX_LINEAGE_NODES)
        .map((q) => ({ node: q.node, opType: q.opType, weight: q.weight, elements: BigInt(q.elements) })),
      floatNodes: variant.keptFloat
        .slice(0, MAX_LINEAGE_NODES)
        .map((f) => ({ node: f.node, opType: f.opType, reason: f.reason })),
      quantizedNodeCount: variant.quantized.length,
      floatNodeCount: variant.keptFloat.length,
      accuracy: report,
    });
    const version = await this.catalog.createVersion(
      {
        $typeName: 'infermesh.registry.v1.CreateModelVersionRequest',
        parent: `models/${targetModelId}`,
        versionId,
        artifactSha256: stored.sha256,
        maxBatchSize: signature.maxBatchSize,
        processing: source.processing,
        batching: source.batching,
        warmUp: source.warmUp,
        execution: request.execution ?? source.execution,
      },
      lineage,
    );
    this.logger.info('model version derived', {
      version: version.name,
      source: source.name,
      method: QUANTIZATION_METHOD,
      quantized_nodes: variant.quantized.length,
      float_nodes: variant.keptFloat.length,
      artifact_bytes: stored.sizeBytes,
      source_artifact_bytes: bytes.length,
      relative_l2: accuracy.relativeL2,
      max_abs_diff: accuracy.maxAbsDiff,
    });
    return version;
  }

  /** The source version: named, or the model's stable version, else its latest READY one. */
  private async source(name: string): Promise<ModelVersion> {
    const ids = splitVersionName(name);
    const model = await this.catalog.getModel(
      ids === undefined ? `models/${parseModelName(name, 'source')}` : `models/${ids.modelId}`,
    );
    if (ids !== undefined) {
      const version = model.versions.find((v) => versionIdOf(v.name) === ids.versionId);
      if (version === undefined) {
        throw Errors.versionNotFound(`${model.name} has no version ${ids.versionId}`, {
          metadata: {
            model: model.name,
            version: ids.versionId,
          },
        });
      }
      return version;
    }
    const serving = stableVersion(model);
    if (serving === undefined) {
      throw Errors.versionNotReady(
        `${model.name} has no READY version to derive from; name one (models/{model}/versions/{version})`,
      );
    }
    return serving;
  }

  /** The model, or undefined when it does not exist (yet). */
  private async modelIfAny(modelId: string): Promise<Model | undefined> {
    try {
      return await this.catalog.getModel(`models/${modelId}`);
    } catch (error) {
      if (error instanceof RpcError && error.reason === 'MODEL_NOT_FOUND') return undefined;
      throw error;
    }
  }

  /** The given samples, checked like a warm-up; else random inputs from the signature. */
  private calibration(
    given: readonly WarmUpSample[],
    signature: Signature,
  ): { samples: WarmUpSample[]; synthetic: boolean } {
    for (const spec of signature.inputs) {
      if (spec.datatype === DataType.BYTES) {
        throw Errors.notQuantizable(
          `input "${spec.name}" is BYTES: the registry compares models on numeric inputs only`,
        );
      }
    }
    if (given.length > 0) {
      const checked = checkWarmUp(create(WarmUpSchema, { samples: [...given] }), signature, 'calibration')!;
      const elements = checked.samples.reduce(
        (sum, sample) => sum + sample.inputs.reduce((n, input) => n + elementCount(input.shape), 0),
        0,
      );
      if (elements > MAX_CALIBRATION_ELEMENTS) {
        throw Errors.invalidRequest(
          `calibration: the samples have ${elements} input elements in all, above the limit of ${MAX_CALIBRATION_ELEMENTS} (MAX_CALIBRATION_ELEMENTS); give fewer or smaller samples`,
        );
      }
      return { samples: checked.samples, synthetic: false };
    }
    // One item: every dynamic dimension but the batch is 1. The batch shrinks so that the samples
    // stay within MAX_CALIBRATION_ELEMENTS.
    const item = signature.inputs.reduce(
      (n, spec) => n + elementCount(spec.shape.slice(1).map((d) => (d >= 0n ? d : 1n))),
      0,
    );
    const fits = Math.floor(MAX_CALIBRATION_ELEMENTS / SYNTHETIC_CALIBRATION_SAMPLES / Math.max(item, 1));
    const batch = signature.maxBatchSize > 0 ? Math.min(SYNTHETIC_CALIBRATION_BATCH, signature.maxBatchSize, fits) : 1;
    if (batch < 1 || (signature.maxBatchSize <= 0 && fits < 1)) {
      throw Errors.notQuantizable(
        `one item of the model's inputs has ${item} elements, too many for ${SYNTHETIC_CALIBRATION_SAMPLES} synthetic samples within ${MAX_CALIBRATION_ELEMENTS} (MAX_CALIBRATION_ELEMENTS); give calibration samples`,
      );
    }
    const samples = Array.from({ length: SYNTHETIC_CALIBRATION_SAMPLES }, (_, i) =>
      create(WarmUpSampleSchema, {
        name: `synthetic ${i + 1}`,
        inputs: signature.inputs.map((spec) => ({
          name: spec.name,
          datatype: spec.datatype,
          shape: spec.shape.map((d, axis) => (d >= 0n ? d : axis === 0 ? BigInt(batch) : 1n)),
          contents: { case: 'randomData' as const, value: true },
        })),
      }),
    );
    return { samples, synthetic: true };
  }

  /** Refuses a variant onnxruntime cannot load, or whose inputs and outputs are not the source's. */
  private async checkLoads(variant: Uint8Array, source: ModelVersion, signature: Signature): Promise<void> {
    const read = readOnnxSignature(variant);
    const same = (a: readonly TensorSpec[], b: readonly TensorSpec[]) =>
      a.length === b.length && a.every((spec, i) => equals(TensorSpecSchema, spec, b[i]!));
    if (!same(read.inputs, signature.inputs) || !same(read.outputs, signature.outputs)) {
      throw Errors.internal(
        `the int8 variant of ${source.name} does not keep its inputs and outputs; nothing was registered`,
      );
    }
    try {
      await this.onnx.load(variant);
    } catch (error) {
      throw Errors.notQuantizable(
        `onnxruntime cannot load the int8 variant of ${source.name}: ${error instanceof Error ? error.message : String(error)}`,
      );
    }
  }

  /**
   * Both models on every calibration sample, compared output by output, summed over the samples.
   * The samples' tensors are made one sample at a time, so a derivation holds one sample's inputs and
   * outputs at once.
   */
  private async compare(
    source: Uint8Array,
    variant: Uint8Array,
    calibration: { samples: WarmUpSample[]; synthetic: boolean },
    signature: Signature,
    sourceName: string,
    stillWanted: () => void,
  ): Promise<Comparison> {
    const sessions: OnnxSession[] = [];
    try {
      const served = await this.onnx.session(source);
      sessions.push(served);
      const candidate = await this.onnx.session(variant);
      sessions.push(candidate);
      let total: Comparison | undefined;
      for (const [i, sample] of calibration.samples.entries()) {
        stillWanted();
        const inputs = sampleInputs(sample, i, signature.inputs);
        let expected: Tensor[];
        try {
          expected = await served.run(inputs);
        } catch (error) {
          const why = `the source cannot run on calibration ${sampleLabel(sample, i)}: ${error instanceof Error ? error.message : String(error)}`;
          // Synthetic inputs the model does not take are not the caller's mistake: it can give its own.
          if (calibration.synthetic) throw Errors.notQuantizable(`${why}; give calibration samples the model takes`);
          throw Errors.invalidRequest(why);
        }
        let actual: Tensor[];
        try {
          actual = await candidate.run(inputs);
        } catch (error) {
          throw Errors.notQuantizable(
            `the int8 variant of ${sourceName} fails on calibration ${sampleLabel(sample, i)}, which the source runs: ${error instanceof Error ? error.message : String(error)}; nothing was registered`,
          );
        }
        const comparison = compareOutputs(expected, actual);
        if (comparison.mismatched > 0) {
          throw Errors.notQuantizable(
            `the int8 variant of ${sourceName} answers calibration ${sampleLabel(sample, i)} with outputs of another shape or datatype than the source's; nothing was registered`,
          );
        }
        total = total === undefined ? comparison : addComparisons(total, comparison);
      }
      return total!;
    } finally {
      await Promise.allSettled(sessions.map((session) => session.release()));
    }
  }
}
