import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import { join } from 'node:path';
import { REPO_ROOT } from './system-fixture';

/**
 * A KServe v2 gRPC client built only from the published protocol file, the way an existing KServe or
 * Triton client would talk to infermesh: dynamic loading, no infermesh code.
 */
export function kserveClient(address: string) {
  const definition = protoLoader.loadSync(join(REPO_ROOT, 'proto', 'inference', 'grpc_service.proto'), {
    keepCase: true,
    longs: String,
    enums: String,
    defaults: true,
    oneofs: true,
  });
  const pkg = grpc.loadPackageDefinition(definition) as unknown as {
    inference: { GRPCInferenceService: grpc.ServiceClientConstructor };
  };
  const client = new pkg.inference.GRPCInferenceService(address, grpc.credentials.createInsecure());
  const call = <T = Record<string, unknown>>(method: string, request: object, key?: string): Promise<T> =>
    new Promise((resolvePromise, reject) => {
      const metadata = new grpc.Metadata();
      if (key !== undefined) metadata.set('authorization', `Bearer ${key}`);
      const fn = (client as unknown as Record<string, (...args: unknown[]) => void>)[method]!;
      fn.call(
        client,
        request,
        metadata,
        { deadline: Date.now() + 30_000 },
        (error: grpc.ServiceError | null, response: T) => (error ? reject(error) : resolvePromise(response)),
      );
    });
  return { call, close: () => client.close() };
}
