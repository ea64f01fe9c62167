import { RpcError } from '@infermesh/grpc';

/** The RpcError a call rejects with; fails the test when it resolves or rejects with anything else. */
export async function rpcRejection(promise: Promise<unknown>): Promise<RpcError> {
  const error = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(RpcError);
  return error as RpcError;
}
