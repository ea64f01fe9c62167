import { createHash, randomBytes } from 'node:crypto';
import { mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ArtifactDigestMismatchError, ArtifactTooLargeError } from './artifact-store';
import { FilesystemArtifactStore } from './artifact-store.filesystem';

async function* chunksOf(bytes: Buffer, size: number): AsyncGenerator<Uint8Array> {
  for (let offset = 0; offset < bytes.length; offset += size) yield bytes.subarray(offset, offset + size);
}

const sha256 = (bytes: Buffer) => createHash('sha256').update(bytes).digest('hex');
const MiB = 1024 * 1024;

describe(FilesystemArtifactStore.name, () => {
  let dir: string;
  let sut: FilesystemArtifactStore;
  beforeEach(() => {
    dir = mkdtempSync(join(tmpdir(), 'infermesh-artifacts-'));
    sut = new FilesystemArtifactStore(dir);
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  /** Everything in the directory but the (empty) upload area. */
  const storedFiles = () => readdirSync(dir).filter((name) => name !== '.incoming');
  const incomingFiles = () => readdirSync(join(dir, '.incoming'));

  it('stores streamed chunks under their SHA-256 and reads them back identical, in bounded chunks', async () => {
    const bytes = randomBytes(3 * MiB + 17);
    const stored = await sut.write(chunksOf(bytes, 64 * 1024), { maxBytes: 10 * MiB });
    expect(stored).toEqual({ sha256: sha256(bytes), sizeBytes: bytes.length, created: true });
    expect(storedFiles()).toEqual([sha256(bytes)]);
    expect(await sut.size(stored.sha256)).toBe(bytes.length);

    const chunks: Buffer[] = [];
    for await (const chunk of (await sut.read(stored.sha256, MiB))!) chunks.push(chunk);
    expect(chunks.every((c) => c.length <= MiB)).toBe(true);
    expect(chunks.length).toBe(4);
    expect(Buffer.concat(chunks).equals(bytes)).toBe(true);
    expect((await sut.readAll(stored.sha256))!.equals(bytes)).toBe(true);
  });

  it('stores the same bytes once when they are uploaded twice', async () => {
    const bytes = randomBytes(1000);
    const first = await sut.write(chunksOf(bytes, 100), { maxBytes: MiB });
    const second = await sut.write(chunksOf(bytes, 333), { maxBytes: MiB });
    expect(first.created).toBe(true);
    expect(second).toEqual({ sha256: first.sha256, sizeBytes: 1000, created: false });
    expect(storedFiles()).toEqual([first.sha256]);
    expect(incomingFiles()).toEqual([]);
  });

  it('stops reading as soon as the size limit is passed and leaves nothing behind', async () => {
    let chunksPulled = 0;
    async function* endless(): AsyncGenerator<Uint8Array> {
      for (;;) {
        chunksPulled += 1;
        yield Buffer.alloc(1000);
      }
    }
    await expect(sut.write(endless(), { maxBytes: 4500 })).rejects.toThrow(ArtifactTooLargeError);
    expect(chunksPulled).toBe(5);
    expect(storedFiles()).toEqual([]);
    expect(incomingFiles()).toEqual([]);
  });

  it('accepts an artifact of exactly the size limit', async () => {
    const bytes = randomBytes(4096);
    expect((await sut.write(chunksOf(bytes, 1000), { maxBytes: 4096 })).sizeBytes).toBe(4096);
  });

  it('refuses bytes that do not hash to the expected SHA-256 and leaves nothing behind', async () => {
    const bytes = randomBytes(2048);
    const wrong = sha256(Buffer.from('something else'));
    const error = await sut
      .write(chunksOf(bytes, 512), { maxBytes: MiB, expectedSha256: () => wrong })
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ArtifactDigestMismatchError);
    expect((error as ArtifactDigestMismatchError).actualSha256).toBe(sha256(bytes));
    expect(storedFiles()).toEqual([]);
    expect(incomingFiles()).toEqual([]);
    expect(await sut.size(sha256(bytes))).toBeUndefined();
  });

  it('accepts bytes that match the expected SHA-256, in upper or lower case', async () => {
    const bytes = randomBytes(2048);
    const stored = await sut.write(chunksOf(bytes, 512), {
      maxBytes: MiB,
      expectedSha256: () => sha256(bytes).toUpperCase(),
    });
    expect(stored.sha256).toBe(sha256(bytes));
  });

  it('removes the partial upload when the stream fails midway', async () => {
    async function* failing(): AsyncGenerator<Uint8Array> {
      yield Buffer.alloc(100);
      throw new Error('client went away');
    }
    await expect(sut.write(failing(), { maxBytes: MiB })).rejects.toThrow('client went away');
    expect(storedFiles()).toEqual([]);
    expect(incomingFiles()).toEqual([]);
  });

  it('commits nothing when the signal is aborted by the time the last chunk has arrived', async () => {
    const controller = new AbortController();
    async function* cancelledAtTheEnd(): AsyncGenerator<Uint8Array> {
      yield Buffer.alloc(100);
      controller.abort(new Error('cancelled by the client'));
    }
    await expect(sut.write(cancelledAtTheEnd(), { maxBytes: MiB, signal: controller.signal })).rejects.toThrow(
      'cancelled by the client',
    );
    expect(storedFiles()).toEqual([]);
    expect(incomingFiles()).toEqual([]);
  });

  it('checks the complete bytes before it commits them, and stores nothing when the check refuses', async () => {
    const bytes = randomBytes(5000);
    const checked: Buffer[] = [];
    const refused = await sut
      .write(chunksOf(bytes, 1000), {
        maxBytes: MiB,
        check: async (complete) => {
          checked.push(complete);
          // Nothing is under its final name while the check runs.
          expect(storedFiles()).toEqual([]);
          throw new Error('not a model');
        },
      })
      .catch((e: unknown) => e);
    expect(refused).toEqual(new Error('not a model'));
    expect(checked.map((b) => b.equals(bytes))).toEqual([true]);
    expect(storedFiles()).toEqual([]);
    expect(incomingFiles()).toEqual([]);

    const stored = await sut.write(chunksOf(bytes, 1000), { maxBytes: MiB, check: async () => undefined });
    expect(storedFiles()).toEqual([stored.sha256]);
  });

  it('does not check bytes that fail sooner: over the limit or not the expected SHA-256', async () => {
    let checks = 0;
    const check = async () => {
      checks += 1;
    };
    await expect(sut.write(chunksOf(randomBytes(5000), 1000), { maxBytes: 4000, check })).rejects.toThrow(
      ArtifactTooLargeError,
    );
    await expect(
      sut.write(chunksOf(randomBytes(500), 100), {
        maxBytes: MiB,
        check,
        expectedSha256: () => sha256(Buffer.from('x')),
      }),
    ).rejects.toThrow(ArtifactDigestMismatchError);
    expect(checks).toBe(0);
    expect(incomingFiles()).toEqual([]);
  });

  it('commits nothing when the upload is cancelled while its bytes are checked', async () => {
    const controller = new AbortController();
    const check = async () => controller.abort(new Error('cancelled during the check'));
    await expect(
      sut.write(chunksOf(randomBytes(500), 100), { maxBytes: MiB, signal: controller.signal, check }),
    ).rejects.toThrow('cancelled during the check');
    expect(storedFiles()).toEqual([]);
    expect(incomingFiles()).toEqual([]);
  });

  it('knows nothing of an unknown or malformed address', async () => {
    const unknown = sha256(Buffer.from('never stored'));
    expect(await sut.size(unknown)).toBeUndefined();
    expect(await sut.read(unknown, MiB)).toBeUndefined();
    expect(await sut.readAll(unknown)).toBeUndefined();
    expect(await sut.size('../../etc/passwd')).toBeUndefined();
    expect(await sut.readAll('.incoming')).toBeUndefined();
  });

  it('stores an empty artifact', async () => {
    const stored = await sut.write(chunksOf(Buffer.alloc(0), 1), { maxBytes: MiB });
    expect(stored.sha256).toBe(sha256(Buffer.alloc(0)));
    expect(stored.sizeBytes).toBe(0);
  });
});
