import { randomBytes } from 'node:crypto';
import { chmod, open, rename, rm } from 'node:fs/promises';
import { join } from 'node:path';

/** One file to replace: its name in the folder, its content and its permission bits. */
export interface FileToWrite {
  name: string;
  content: string;
  mode: number;
}

/**
 * Replaces several files of one folder so that each is always whole: first every content goes to
 * a temporary file beside its target (written, fsynced, given its mode), then the temporaries are
 * renamed over their targets back to back, in the order given, and the folder is fsynced. A failure
 * while staging renames nothing and leaves no temporary behind. Each rename is atomic; the set is
 * not: a reader that opens two of the files while the renames run may see one new and one old.
 */
export async function replaceFiles(dir: string, files: readonly FileToWrite[]): Promise<void> {
  const staged: { temp: string; target: string }[] = [];
  try {
    for (const file of files) {
      const temp = join(dir, `.${file.name}.${process.pid}.${randomBytes(6).toString('hex')}.tmp`);
      staged.push({ temp, target: join(dir, file.name) });
      // Created with the final mode, so that a key is never readable by others, not even briefly.
      const handle = await open(temp, 'wx', file.mode);
      try {
        await handle.writeFile(file.content);
        await handle.sync();
      } finally {
        await handle.close();
      }
      await chmod(temp, file.mode); // the umask may have cleared bits that the mode asks for
    }
    for (const { temp, target } of staged) await rename(temp, target);
  } catch (error) {
    await Promise.all(staged.map(({ temp }) => rm(temp, { force: true })));
    throw error;
  }
  await syncDirectory(dir);
}

/** Makes the renames durable; best effort, as not every file system lets a folder be fsynced. */
async function syncDirectory(dir: string): Promise<void> {
  try {
    const handle = await open(dir, 'r');
    try {
      await handle.sync();
    } finally {
      await handle.close();
    }
  } catch {
    // The renames are done; only their durability across a power loss is left to the file system.
  }
}
