import { create } from '@bufbuild/protobuf';
import { RpcError } from '@infermesh/grpc';
import { type Tensor, type TensorSpec, TensorSpecSchema } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { datatypeFromOrt } from '@infermesh/tensors';
import { existsSync, readdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { InferenceSession, type Tensor as OrtTensor } from 'onnxruntime-node';
import { ModelLoadError, ModelRuntime, type ModelSession } from './model-runtime';
import { fromOrtTensor, toOrtTensor } from './ort-tensors';

export interface OrtRuntimeOptions {
  /** Threads one session uses inside an operator. */
  intraOpThreads: number;
}

/**
 * onnxruntime-node sessions on the calling thread. session.run() blocks the event loop while the
 * model computes: a first cut, to be replaced by an implementation on worker threads.
 */
export class OrtModelRuntime extends ModelRuntime {
  /** Providers whose libraries are missing from this machine: not tried again. */
  private readonly unavailable = new Map<string, string>();

  constructor(private readonly options: OrtRuntimeOptions) {
    super();
    for (const provider of ['cuda', 'tensorrt']) {
      if (!providerLibraryInstalled(provider)) {
        this.unavailable.set(provider, `the ${provider} execution provider is not installed on this host (README: GPU hosts)`);
      }
    }
  }

  async load(model: Uint8Array, executionProviders: readonly string[]): Promise<ModelSession> {
    const failures: string[] = [];
    for (const provider of executionProviders) {
      const missing = this.unavailable.get(provider);
      if (missing !== undefined) {
        failures.push(`${provider}: ${missing}`);
        continue;
      }
      let session: InferenceSession;
      try {
        session = await InferenceSession.create(model, {
          executionProviders: [provider],
          intraOpNumThreads: this.options.intraOpThreads,
          graphOptimizationLevel: 'all',
          logSeverityLevel: 3,
        });
      } catch (error) {
        const message = errorMessage(error);
        if (/failed to load (shared )?library|backend not found/i.test(message)) this.unavailable.set(provider, message);
        failures.push(`${provider}: ${message}`);
        continue;
      }
      try {
        return new OrtModelSession(session, provider);
      } catch (error) {
        await session.release();
        throw error;
      }
    }
    throw new ModelLoadError(`no execution provider could load the model (${failures.join('; ')})`);
  }
}

class OrtModelSession implements ModelSession {
  readonly inputs: readonly TensorSpec[];
  readonly outputs: readonly TensorSpec[];
  private readonly outputNames: ReadonlySet<string>;

  constructor(
    private readonly session: InferenceSession,
    readonly executionProvider: string,
  ) {
    this.inputs = session.inputMetadata.map(toSpec);
    this.outputs = session.outputMetadata.map(toSpec);
    this.outputNames = new Set(this.outputs.map((o) => o.name));
  }

  async run(inputs: readonly Tensor[], outputNames: readonly string[]): Promise<Tensor[]> {
    for (const name of outputNames) {
      if (!this.outputNames.has(name)) {
        throw RpcError.invalidArgument(
          `the model has no output "${name}"; its outputs are ${[...this.outputNames].map((n) => `"${n}"`).join(', ')}`,
          'INVALID_TENSOR',
        );
      }
    }
    const feeds: Record<string, OrtTensor> = {};
    for (const input of inputs) feeds[input.name] = toOrtTensor(input);
    const fetches = outputNames.length > 0 ? outputNames : this.session.outputNames;
    let results: InferenceSession.ReturnType;
    try {
      results = await this.session.run(feeds, fetches);
    } catch (error) {
      throw RpcError.invalidArgument(`the model refused the input: ${errorMessage(error)}`, 'INVALID_TENSOR');
    }
    return fetches.map((name) => {
      const value = results[name];
      if (value === undefined) throw RpcError.invalidArgument(`the model produced no output "${name}"`, 'INVALID_TENSOR');
      return fromOrtTensor(name, value);
    });
  }

  async release(): Promise<void> {
    await this.session.release();
  }
}

function toSpec(meta: InferenceSession.ValueMetadata): TensorSpec {
  if (!meta.isTensor) throw new ModelLoadError(`"${meta.name}" is not a tensor; the worker serves tensor inputs and outputs only`);
  const datatype = datatypeFromOrt(meta.type);
  if (datatype === undefined) throw new ModelLoadError(`"${meta.name}" has type ${meta.type}, which has no KServe datatype`);
  return create(TensorSpecSchema, {
    name: meta.name,
    datatype,
    shape: meta.shape.map((d) => (typeof d === 'number' && d >= 0 ? BigInt(d) : -1n)),
  });
}

function errorMessage(error: unknown): string {
  return (error instanceof Error ? error.message : String(error)).split('\n')[0]!.trim();
}

/**
 * onnxruntime-node's GPU providers are shared libraries its install script adds next to the native
 * binding; without them a session would only fail after logging a library-load error.
 */
function providerLibraryInstalled(provider: string): boolean {
  if (process.platform !== 'linux') return true; // elsewhere, let onnxruntime try
  const binRoot = join(dirname(require.resolve('onnxruntime-node')), '..', 'bin');
  const library = `libonnxruntime_providers_${provider}.so`;
  try {
    for (const napi of readdirSync(binRoot)) {
      if (existsSync(join(binRoot, napi, process.platform, process.arch, library))) return true;
    }
  } catch {
    return false;
  }
  return false;
}
