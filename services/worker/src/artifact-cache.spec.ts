import { createHash, randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ManualClock } from '@infermesh/testing';
import { ArtifactCache, ArtifactVerificationError } from './artifact-cache';

const sha256 = (bytes: Uint8Array) => createHash('sha256').update(bytes).digest('hex');

async function* chunked(bytes: Buffer, size = 1000): AsyncIterable<Uint8Array> {
  for (let i = 0; i < bytes.length; i += size) yield bytes.subarray(i, i + size);
}

describe(ArtifactCache.name, () => {
  let dir: string;
  let sut: ArtifactCache;
  beforeEach(() => {
    dir = join(mkdtempSync(join(tmpdir(), 'worker-artifacts-')), 'cache');
    sut = new ArtifactCache(dir);
  });
  afterEach(() => rmSync(join(dir, '..'), { recursive: true, force: true }));

  it('downloads, verifies and keeps an artifact, then serves it without downloading again', async () => {
    const bytes = randomBytes(4567);
    const sha = sha256(bytes);
    expect(Buffer.compare(await sut.fetch(sha, () => chunked(bytes)), bytes)).toBe(0);
    expect(existsSync(sut.pathOf(sha))).toBe(true);
    const again = await sut.fetch(sha, () => {
      throw new Error('downloaded twice');
    });
    expect(Buffer.compare(again, bytes)).toBe(0);
  });

  it('refuses bytes whose SHA-256 is not the one recorded, and keeps nothing', async () => {
    const recorded = sha256(randomBytes(100));
    const act = sut.fetch(recorded, () => chunked(randomBytes(3000)));
    await expect(act).rejects.toThrow(ArtifactVerificationError);
    await expect(sut.fetch(recorded, () => chunked(randomBytes(3000)))).rejects.toThrow(/hash to [0-9a-f]{64}/);
    expect(readdirSync(dir)).toEqual([]);
  });

  it('downloads again when the local copy was damaged', async () => {
    const bytes = randomBytes(2000);
    const sha = sha256(bytes);
    await sut.fetch(sha, () => chunked(bytes));
    writeFileSync(sut.pathOf(sha), Buffer.from('damaged'));
    let downloads = 0;
    const fetched = await sut.fetch(sha, () => {
      downloads += 1;
      return chunked(bytes);
    });
    expect(downloads).toBe(1);
    expect(Buffer.compare(fetched, bytes)).toBe(0);
  });

  it('passes a failed download through and leaves no partial file', async () => {
    const bytes = randomBytes(5000);
    async function* broken(): AsyncIterable<Uint8Array> {
      yield bytes.subarray(0, 1000);
      throw new Error('connection reset');
    }
    await expect(sut.fetch(sha256(bytes), broken)).rejects.toThrow('connection reset');
    expect(readdirSync(dir)).toEqual([]);
  });

  it('refuses a recorded SHA-256 that is not lower-case hex, without downloading', async () => {
    await expect(sut.fetch('../../etc/passwd', () => chunked(Buffer.alloc(1)))).rejects.toThrow(
      ArtifactVerificationError,
    );
  });

  it('keeps its copies within maxBytes, deleting the least recently used first', async () => {
    const evicted: string[] = [];
    const clock = new ManualClock();
    const bounded = new ArtifactCache(dir, 2500, (sha) => evicted.push(sha), clock);
    const [a, b, c] = [randomBytes(1000), randomBytes(1000), randomBytes(1000)];
    // A second between uses: file times may have whole seconds only.
    await bounded.fetch(sha256(a), () => chunked(a));
    clock.advance(1_000);
    await bounded.fetch(sha256(b), () => chunked(b));
    clock.advance(1_000);
    await bounded.fetch(sha256(a), () => chunked(a)); // a used again: b is now the least recent
    clock.advance(1_000);
    await bounded.fetch(sha256(c), () => chunked(c));
    expect(evicted).toEqual([sha256(b)]);
    expect(existsSync(bounded.pathOf(sha256(a)))).toBe(true);
    expect(existsSync(bounded.pathOf(sha256(b)))).toBe(false);
    expect(await bounded.usage()).toEqual({ files: 2, bytes: 2000 });
  });

  it('keeps a newly downloaded artifact even when it alone is larger than maxBytes', async () => {
    const bounded = new ArtifactCache(dir, 100);
    const big = randomBytes(1000);
    await bounded.fetch(sha256(big), () => chunked(big));
    expect(await bounded.usage()).toEqual({ files: 1, bytes: 1000 });
  });
});
