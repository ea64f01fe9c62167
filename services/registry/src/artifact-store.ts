/** An artifact as stored: its content address and size. */
export interface StoredArtifact {
  /** Lower-case hex SHA-256 of the bytes. */
  sha256: string;
  sizeBytes: number;
  /** False when the same bytes were already stored (nothing new was written). */
  created: boolean;
}

export interface ArtifactWriteOptions {
  /** The write fails with ArtifactTooLargeError as soon as more bytes than this arrive. */
  maxBytes: number;
  /**
   * The SHA-256 the bytes must hash to, if any: read once the last chunk has arrived (so it may come
   * with any chunk); on a mismatch the write fails with ArtifactDigestMismatchError.
   */
  expectedSha256?: () => string | undefined;
  /**
   * Checked after the last chunk, right before the artifact is committed: when aborted by then, the
   * write fails with the signal's reason and stores nothing. (A cancelled stream may look complete.)
   */
  signal?: AbortSignal;
  /**
   * Checks the complete bytes once they hash right, before they are committed: when it throws, the
   * write fails with its error and stores nothing. Runs for bytes already stored too.
   */
  check?: (bytes: Buffer) => Promise<void>;
}

export class ArtifactTooLargeError extends Error {
  constructor(readonly maxBytes: number) {
    super(`artifact is larger than the limit of ${maxBytes} bytes`);
    this.name = 'ArtifactTooLargeError';
  }
}

export class ArtifactDigestMismatchError extends Error {
  constructor(
    readonly expectedSha256: string,
    readonly actualSha256: string,
  ) {
    super(`artifact bytes hash to ${actualSha256}, not the expected ${expectedSha256}`);
    this.name = 'ArtifactDigestMismatchError';
  }
}

/** A lower-case hex SHA-256, the only form of artifact address the stores accept. */
export const SHA256_HEX = /^[0-9a-f]{64}$/;

/**
 * Content-addressed artifact bytes. A failed write leaves nothing behind; writing bytes that are
 * already stored stores them once.
 */
export abstract class ArtifactStore {
  /** Streams chunks in while hashing them; stores them under their SHA-256 once complete. */
  abstract write(chunks: AsyncIterable<Uint8Array>, options: ArtifactWriteOptions): Promise<StoredArtifact>;
  /** The size of a stored artifact, or undefined when there is none with that SHA-256. */
  abstract size(sha256: string): Promise<number | undefined>;
  /** The whole artifact, or undefined when absent. */
  abstract readAll(sha256: string): Promise<Buffer | undefined>;
  /** The artifact in chunks of at most chunkBytes, or undefined when absent. */
  abstract read(sha256: string, chunkBytes: number): Promise<AsyncIterable<Buffer> | undefined>;
}

/** Bytes already in memory as the chunks ArtifactStore.write takes: one. */
export async function* chunksOf(bytes: Uint8Array): AsyncGenerator<Uint8Array> {
  yield bytes;
}
