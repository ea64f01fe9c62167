import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { readJsonFileSync } from './json-file';

describe(readJsonFileSync.name, () => {
  const dir = mkdtempSync(join(tmpdir(), 'json-file-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it('decodes the content of the file', () => {
    const file = join(dir, 'store.json');
    writeFileSync(file, '{"a": 1}\n');

    expect(readJsonFileSync(file, 'store file', (json) => Object.keys(json as object))).toEqual(['a']);
  });

  it('is undefined when the file does not exist', () => {
    expect(readJsonFileSync(join(dir, 'missing.json'), 'store file', () => 'decoded')).toBeUndefined();
  });

  it('names a file that is not JSON, or that the decoder refuses, as corrupt', () => {
    const file = join(dir, 'corrupt.json');
    writeFileSync(file, '{ not json');
    expect(() => readJsonFileSync(file, 'store file', (json) => json)).toThrow(
      new RegExp(`^store file ${file} is corrupt: `),
    );

    writeFileSync(file, '[]');
    const refuse = () => {
      throw new Error('not an object');
    };
    expect(() => readJsonFileSync(file, 'store file', refuse)).toThrow(`store file ${file} is corrupt: not an object`);
  });

  it('passes on an error reading the file as it stands', () => {
    const folder = join(dir, 'a-directory');
    mkdirSync(folder);

    expect(() => readJsonFileSync(folder, 'store file', (json) => json)).toThrow(/^EISDIR/);
  });
});
