import type { WatchKeysResponse } from '@infermesh/proto/gen/infermesh/cache/v1/cache_pb';
import { FINGERPRINT_BYTES, KeyFilter } from '@infermesh/tensors';
import { ManualClock, rpcRejection } from '@infermesh/testing';
import { randomBytes } from 'node:crypto';
import { status } from '@grpc/grpc-js';
import { FILTER_CAPACITY, HeldKeys, KEY_DIGEST_INTERVAL_MS, MAX_KEY_WATCHERS } from './held-keys';

/** Reads a watch's messages as they come. */
function follow(stream: AsyncGenerator<WatchKeysResponse>) {
  const received: WatchKeysResponse[] = [];
  const done = (async () => {
    for await (const message of stream) received.push(message);
  })();
  return { received, done };
}

const settle = () => new Promise((resolve) => setImmediate(resolve));

describe(HeldKeys.name, () => {
  const held = new Map<string, Buffer>();
  let clock: ManualClock;
  let sut: HeldKeys;
  let abort: AbortController;
  const store = (key = randomBytes(32)) => {
    held.set(key.toString('hex'), key);
    sut.stored(key);
    return key;
  };

  beforeEach(() => {
    held.clear();
    clock = new ManualClock();
    sut = new HeldKeys(() => held.values(), clock);
    abort = new AbortController();
  });
  afterEach(() => sut.close());

  it('sends a watcher the whole filter, then the keys stored since, together, every KEY_DIGEST_INTERVAL_MS', async () => {
    const before = [store(), store()];
    const { received, done } = follow(sut.watch(abort.signal));
    await settle();
    expect(received).toHaveLength(1);
    const filter = new KeyFilter(received[0]!.filter!.bits, received[0]!.filter!.hashes);
    expect(before.every((key) => filter.has(key))).toBe(true);
    expect(received[0]!.added).toHaveLength(0);

    const after = [store(), store(), store()];
    expect(after.some((key) => filter.has(key))).toBe(false);
    clock.advance(KEY_DIGEST_INTERVAL_MS - 1);
    await settle();
    expect(received).toHaveLength(1);
    clock.advance(1);
    await settle();
    expect(received).toHaveLength(2);
    expect(received[1]!.filter).toBeUndefined();
    expect(Buffer.from(received[1]!.added)).toEqual(Buffer.concat(after.map((k) => k.subarray(0, FINGERPRINT_BYTES))));
    filter.addFingerprints(received[1]!.added);
    expect(after.every((key) => filter.has(key))).toBe(true);
    expect(sut.watcherCount).toBe(1);

    abort.abort();
    await done;
    expect(sut.watcherCount).toBe(0);
  });

  it('builds the filter again from the keys held once full, larger, and sends it whole to every watcher', async () => {
    const { received } = follow(sut.watch(abort.signal));
    await settle();
    const first = received[0]!.filter!.bits.byteLength;
    // The store holds the first keys only: the rest left it (evicted, say) as soon as stored.
    const kept = Array.from({ length: 40_000 }, () => store());
    for (let i = kept.length; i <= FILTER_CAPACITY.min; i++) sut.stored(randomBytes(32));
    await settle();
    expect(sut.rebuilds).toBe(1);
    const whole = received.filter((m) => m.filter !== undefined).at(-1)!;
    expect(received.indexOf(whole)).toBeGreaterThan(0);
    const rebuilt = new KeyFilter(whole.filter!.bits, whole.filter!.hashes);
    expect(whole.filter!.bits.byteLength).toBeGreaterThan(first);
    // Sized for twice the keys held.
    expect(whole.filter!.bits.byteLength).toBe((2 * kept.length * 10) / 8);
    expect(kept.every((key) => rebuilt.has(key))).toBe(true);
    abort.abort();
  });

  it('sizes a filter it builds again within the largest size, however many keys are held', async () => {
    const bounded = new HeldKeys(() => held.values(), clock, { min: 16, max: 64 });
    for (let i = 0; i < 100; i++) {
      const key = randomBytes(32);
      held.set(key.toString('hex'), key);
      bounded.stored(key);
    }
    // At 17 keys (sized for 34), 35 (64, the most) and 68; then every 32 keys at least, not at each.
    expect(bounded.rebuilds).toBe(3);
    const stream = bounded.watch(abort.signal);
    expect((await stream.next()).value?.filter?.bits.byteLength).toBe((64 * 10) / 8);
    abort.abort();
    bounded.close();
  });

  it('sends a watcher that does not keep up the whole filter, not every key stored meanwhile', async () => {
    const stream = sut.watch(abort.signal);
    expect((await stream.next()).value.filter).toBeDefined();
    // Not read meanwhile.
    const keys = Array.from({ length: 70_000 }, () => store());
    clock.advance(KEY_DIGEST_INTERVAL_MS);
    const next = (await stream.next()).value as WatchKeysResponse;
    expect(next.filter).toBeDefined();
    expect(next.added).toHaveLength(0);
    const filter = new KeyFilter(next.filter!.bits, next.filter!.hashes);
    expect(keys.every((key) => filter.has(key))).toBe(true);
    abort.abort();
    expect((await stream.next()).done).toBe(true);
  });

  it('refuses a watcher past MAX_KEY_WATCHERS, RESOURCE_EXHAUSTED, and takes one again once another left', async () => {
    const streams = Array.from({ length: MAX_KEY_WATCHERS }, () => follow(sut.watch(abort.signal)));
    await settle();
    expect(sut.watcherCount).toBe(MAX_KEY_WATCHERS);
    const other = new AbortController();
    const error = await rpcRejection(sut.watch(other.signal).next());
    expect(error.code).toBe(status.RESOURCE_EXHAUSTED);
    expect(error.message).toContain(`${MAX_KEY_WATCHERS} watchers`);
    abort.abort();
    await Promise.all(streams.map((s) => s.done));
    expect((await sut.watch(other.signal).next()).value?.filter).toBeDefined();
    other.abort();
  });

  it('ends every stream when closed', async () => {
    const { done } = follow(sut.watch(abort.signal));
    await settle();
    sut.close();
    await done;
    expect(sut.watcherCount).toBe(0);
  });
});
