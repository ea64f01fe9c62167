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
