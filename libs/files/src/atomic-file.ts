import { randomBytes } from 'node:crypto';
import { open, rename, rm } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';

/**
 * Replaces a file's content so that a reader (or a restart after a crash) sees either the old
 * content or the new one, never a mix: writes a temporary file beside it, fsyncs it, renames it over
 * the file. The temporary file is removed when anything fails.
 */
export async function writeFileAtomic(file: string, content: string | Uint8Array): Promise<void> {
  const temp = join(dirname(file), `.${basename(file)}.${process.pid}.${randomBytes(6).toString('hex')}.tmp`);
  try {
    const handle = await open(temp, 'w');
    try {
      await handle.writeFile(content);
      await handle.sync();
    } finally {
      await handle.close();
    }
    await rename(temp, file);
  } catch (error) {
    await rm(temp, { force: true });
    throw error;
  }
}
