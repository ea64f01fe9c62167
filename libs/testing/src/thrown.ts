/**
 * The error of class `type` that `fn` throws, to look into (a ConfigError's problems, an RpcError's
 * code); anything else it throws is rethrown, and throwing nothing fails.
 */
export function thrownBy<E extends Error>(fn: () => unknown, type: abstract new (...args: never[]) => E): E {
  try {
    fn();
  } catch (error) {
    if (error instanceof type) return error;
    throw error;
  }
  throw new Error(`expected ${type.name} to be thrown`);
}
