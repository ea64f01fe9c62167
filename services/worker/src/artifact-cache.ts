import { createHash, randomBytes } from 'node:crypto';
import { mkdir, open, readFile, rename, rm } from 'node:fs/promises';
import { join } from 'node:path';

/** The bytes received are not the artifact the registry recorded. */
export class ArtifactVerificationError extends Error {
  override readonly name = 'ArtifactVerificationError';
}

const SHA256_HEX = /^[0-9a-f]{64}$/;

/**
 * The worker's local copy of model artifacts, one file per SHA-256 in a directory. Every artifact
 * is verified against its SHA-256 when it is downloaded and again when it is read back, so neither
 * a bad transfer nor a damaged file ever reaches the runtime.
 */
export class ArtifactCache {
  constructor(readonly dir: string) {}

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
      if (sha256Hex(cached) === sha256) return cached;
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
      throw new ArtifactVerificationError(`artifact ${sha256} failed verification: the downloaded bytes hash to ${actual}`);
    }
    await rename(partial, file);
    return Buffer.concat(chunks);
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
