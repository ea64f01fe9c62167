import { Injectable } from '@nestjs/common';
import { InferenceSession } from 'onnxruntime-node';

/**
 * onnxruntime-node behind a small seam: whether it can create a session from a model's bytes, as a
 * worker will. The session is released at once; it runs on one thread, so that an upload does not
 * take the registry's cores.
 */
@Injectable()
export class OnnxValidator {
  /** Resolves when onnxruntime can load the model; rejects with onnxruntime's error when it cannot. */
  async load(bytes: Uint8Array): Promise<void> {
    const session = await InferenceSession.create(bytes, { executionProviders: ['cpu'], intraOpNumThreads: 1, interOpNumThreads: 1 });
    await session.release();
  }
}
