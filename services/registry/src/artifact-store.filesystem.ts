import { createHash, randomBytes } from 'node:crypto';
import { createReadStream, mkdirSync } from 'node:fs';
import { type FileHandle, open, readFile, rename, rm, stat } from 'node:fs/promises';
import { join } from 'node:path';
import {
  ArtifactDigestMismatchError,
  ArtifactStore,
  type ArtifactWriteOptions,
  ArtifactTooLargeError,
  SHA256_HEX,
  type StoredArtifact,
} from './artifact-store';

/**
 * Artifacts as files named by their SHA-256 in one directory (a volume shared by the registry
 * replicas on Kubernetes). Uploads stream into `.incoming/` in the same directory, then are checked
 * and renamed into place, so a file under its final name is always complete and checked; a write that
 * fails anywhere removes its temporary file.
 */
export class FilesystemArtifactStore extends ArtifactStore {
  private readonly incomingDir: string;

  constructor(private readonly dir: string) {
    super();
    this.incomingDir = join(dir, '.incoming');
    mkdirSync(this.incomingDir, { recursive: true });
  }

  async write(chunks: AsyncIterable<Uint8Array>, options: ArtifactWriteOptions): Promise<StoredArtifact> {
    const temp = join(this.incomingDir, `${process.pid}.${randomBytes(8).toString('hex')}`);
    let handle: FileHandle | undefined = await open(temp, 'wx');
    try {
      const hash = createHash('sha256');
      let sizeBytes = 0;
      for await (const chunk of chunks) {
        sizeBytes += chunk.byteLength;
        if (sizeBytes > options.maxBytes) throw new ArtifactTooLargeError(options.maxBytes);
        hash.update(chunk);
        await handle.write(chunk);
      }
      await handle.sync();
      await handle.close();
      handle = undefined;
      const sha256 = hash.digest('hex');
      const expected = options.expectedSha256?.()?.toLowerCase();
      if (expected !== undefined && expected !== '' && expected !== sha256)
        throw new ArtifactDigestMismatchError(expected, sha256);
      options.signal?.throwIfAborted();
      if (options.check !== undefined) {
        await options.check(await readFile(temp));
        options.signal?.throwIfAborted();
      }
      const target = this.path(sha256);
      if ((await this.size(sha256)) !== undefined) {
        await rm(temp, { force: true });
        return { sha256, sizeBytes, created: false };
      }
      await rename(temp, target);
      return { sha256, sizeBytes, created: true };
    } catch (error) {
      await handle?.close().catch(() => undefined);
      await rm(temp, { force: true });
      throw error;
    }
  }

  async size(sha256: string): Promise<number | undefined> {
    if (!SHA256_HEX.test(sha256)) return undefined;
    try {
      return (await stat(this.path(sha256))).size;
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
      throw error;
    }
  }

  async readAll(sha256: string): Promise<Buffer | undefined> {
    if (!SHA256_HEX.test(sha256)) return undefined;
    try {
      return await readFile(this.path(sha256));
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
      throw error;
    }
  }

  async read(sha256: string, chunkBytes: number): Promise<AsyncIterable<Buffer> | undefined> {
    if (!SHA256_HEX.test(sha256)) return undefined;
    let handle: FileHandle;
    try {
      handle = await open(this.path(sha256), 'r');
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
      throw error;
    }
    // The stream owns the open file from here and closes it when it ends or is destroyed.
    return createReadStream('', { fd: handle, highWaterMark: chunkBytes }) as AsyncIterable<Buffer>;
  }

  private path(sha256: string): string {
    return join(this.dir, sha256);
  }
}
