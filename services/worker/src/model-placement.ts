import { Errors } from '@infermesh/grpc';
import type { WorkerConfig } from './worker.config';

/** Whether this worker serves the model: WORKER_MODELS names it, or names nothing (every model). */
export function isPlaced(config: Pick<WorkerConfig, 'placedModels'>, model: string): boolean {
  return config.placedModels.size === 0 || config.placedModels.has(model);
}

/**
 * Refuses a request for a model this worker does not serve with FAILED_PRECONDITION: sending it
 * again to the same worker cannot help, another worker may serve it.
 */
export function assertPlaced(
  config: Pick<WorkerConfig, 'placedModels' | 'workerId'>,
  model: string,
  version?: string,
): void {
  if (isPlaced(config, model)) return;
  const served = [...config.placedModels].map((m) => `"${m}"`).join(', ');
  throw Errors.modelNotPlaced(
    `model "${model}" is not placed on worker ${config.workerId}, which serves only ${served} (WORKER_MODELS); send it to a worker that serves it`,
    { metadata: { model, ...(version !== undefined && { version }), worker_id: config.workerId } },
  );
}
