import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { writeFileAtomic } from './atomic-file';

describe(writeFileAtomic.name, () => {
  let dir: string;

  beforeEach(() => {
    dir = mkdtempSync(join(tmpdir(), 'atomic-file-'));
  });

  afterEach(() => {
    rmSync(dir, { recursive: true, force: true });
  });

  it('replaces the content and leaves no temporary file', async () => {
    const file = join(dir, 'store.json');
    writeFileSync(file, 'old');

    await writeFileAtomic(file, 'new');

    expect(readFileSync(file, 'utf8')).toBe('new');
    expect(readdirSync(dir)).toEqual(['store.json']);
  });

  it('keeps the old content and removes its temporary file when the rename fails', async () => {
    const target = join(dir, 'a-directory');
    // Renaming a file over a non-empty directory fails.
    writeFileSync(join(dir, 'keep'), 'x');
    mkdirSync(target);
    writeFileSync(join(target, 'inside'), 'y');

    await expect(writeFileAtomic(target, 'content')).rejects.toThrow();

    expect(readdirSync(dir).sort()).toEqual(['a-directory', 'keep']);
  });
});
