/**
 * What this library's specs wait with. libs/testing has the same (its `eventually`) but depends on
 * this library (GrpcServer, RpcError), so that these specs cannot import it.
 */

/** Resolves when the condition holds, polling; fails after timeoutMs. */
export async function eventually(condition: () => boolean, timeoutMs = 5_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error('condition not met in time');
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

/** A promise and what resolves it, for a handler to say where it is or to wait until told. */
export function deferred(): { promise: Promise<void>; resolve: () => void } {
  let resolve!: () => void;
  const promise = new Promise<void>((r) => (resolve = r));
  return { promise, resolve };
}
