// What specs wait with. It lives beside ManualClock in libs/clock (as a `.testing` file, which no
// production build holds) so that the specs of the libraries libs/testing depends on (libs/grpc) can
// use it too; libs/testing re-exports it for everything else.

/**
 * Waits until `condition()` holds (it may answer with a promise), looking every `stepMs`; throws when
 * it has not after `timeoutMs`.
 */
export async function eventually(
  condition: () => boolean | Promise<boolean>,
  timeoutMs = 5_000,
  stepMs = 10,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error(`condition not met in ${timeoutMs} ms`);
    await new Promise((resolve) => setTimeout(resolve, stepMs));
  }
}

/** A promise and what resolves it, for a handler to say where it is or to wait until told. */
export interface Deferred {
  promise: Promise<void>;
  resolve(): void;
}

export function deferred(): Deferred {
  let resolve!: () => void;
  const promise = new Promise<void>((r) => (resolve = r));
  return { promise, resolve };
}
