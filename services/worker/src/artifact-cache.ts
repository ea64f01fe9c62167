import { type Clock, systemClock } from '@infermesh/clock';
import { createHash, randomBytes } from 'node:crypto';
import { mkdir, open, readdir, readFile, rename, rm, stat, utimes } from 'node:fs/promises';
import { join } from 'node:path';

/** The bytes received are not the artifact the registry recorded. */
export class ArtifactVerificationError extends Error {
  override readonly name = 'ArtifactVerificationError';
}

const SHA256_HEX = /^[0-9a-f]{64}$/;

/**
 * The worker's local copy of model artifacts, one file per SHA-256 in a directory. Every artifact
 * is verified against its SHA-256 when it is downloaded and again when it is read back, so neither
 * a bad transfer nor a damaged file ever reaches the runtime. The copies take at most `maxBytes` of
 * disk: after each download the least recently used others are deleted until they fit (the newest
 * is kept even when it alone is larger). A copy's modification time is when it was last used.
 */
export class ArtifactCache {
  constructor(
    readonly dir: string,
    readonly maxBytes = Number.MAX_SAFE_INTEGER,
    /** Told about each copy deleted to stay within maxBytes. */
    private readonly onEvicted: (sha256: string, bytes: number) => void = () => undefined,
    /** Time: when a copy was last used (systemClock unless given). */
    private readonly clock: Clock = systemClock,
  ) {}

  pathOf(sha256: string): string {
    return join(this.dir, `${sha256}.onnx`);
  }

  /**
   * The verified bytes of an artifact: from the local copy when it is intact, otherwise from
   * `download`, kept only when they hash to `sha256`. Throws ArtifactVerificationError on a mismatch;
   * download errors pass through.
   */
  async fetch(sha256: string, download: () => AsyncIterable<Uint8Array>): Promise<Buffer> {
    if (!SHA256_HEX.test(sha256)) throw new ArtifactVerificationError(`"${sha256}" is not a lower-case hex SHA-256`);
    const file = this.pathOf(sha256);
    const cached = await readIfPresent(file);
    if (cached !== undefined) {
      if (sha256Hex(cached) === sha256) {
        await this.used(file);
        return cached;
      }
      await rm(file, { force: true }); // damaged: fetch it again
    }
    await mkdir(this.dir, { recursive: true });
    const partial = `${file}.${randomBytes(6).toString('hex')}.partial`;
    const hash = createHash('sha256');
    const chunks: Buffer[] = [];
    const handle = await open(partial, 'w');
    try {
      for await (const chunk of download()) {
        const bytes = Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
        hash.update(bytes);
        chunks.push(bytes);
        await handle.write(bytes);
      }
    } catch (error) {
      await handle.close();
      await rm(partial, { force: true });
      throw error;
    }
    await handle.close();
    const actual = hash.digest('hex');
    if (actual !== sha256) {
      await rm(partial, { force: true });
      throw new ArtifactVerificationError(
        `artifact ${sha256} failed verification: the downloaded bytes hash to ${actual}`,
      );
    }
    await rename(partial, file);
    await this.used(file);
    await this.prune(file);
    return Buffer.concat(chunks);
  }

  /** The artifacts kept and their total size. */
  async usage(): Promise<{ files: number; bytes: number }> {
    const entries = await this.entries();
    return { files: entries.length, bytes: entries.reduce((n, e) => n + e.bytes, 0) };
  }

  /** Marks a copy used now: its modification time, for pruning. */
  private async used(file: string): Promise<void> {
    const now = this.clock.date();
    await utimes(file, now, now).catch(() => undefined);
  }

  /** Deletes least recently used copies other than `keep` until the rest fit in maxBytes. */
  private async prune(keep: string): Promise<void> {
    const entries = await this.entries();
    let total = entries.reduce((n, e) => n + e.bytes, 0);
    for (const entry of entries.sort((a, b) => a.usedMs - b.usedMs)) {
      if (total <= this.maxBytes) return;
      if (entry.path === keep) continue;
      await rm(entry.path, { force: true });
      total -= entry.bytes;
      this.onEvicted(entry.sha256, entry.bytes);
    }
  }

  private async entries(): Promise<{ path: string; sha256: string; bytes: number; usedMs: number }[]> {
    let names: string[];
    try {
      names = await readdir(this.dir);
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === 'ENOENT') return [];
      throw error;
    }
    const found = [];
    for (const name of names) {
      const match = /^([0-9a-f]{64})\.onnx$/.exec(name);
      if (match === null) continue;
      const path = join(this.dir, name);
      const info = await stat(path).catch(() => undefined);
      if (info !== undefined) found.push({ path, sha256: match[1]!, bytes: info.size, usedMs: info.mtimeMs });
    }
    return found;
  }
}

function sha256Hex(bytes: Uint8Array): string {
  return createHash('sha256').update(bytes).digest('hex');
}

async function readIfPresent(file: string): Promise<Buffer | undefined> {
  try {
    return await readFile(file);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw error;
  }
}
