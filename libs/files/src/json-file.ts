import { readFileSync } from 'node:fs';

/**
 * The content of a JSON file, decoded by `decode`; undefined when the file does not exist. A file
 * that cannot be read is an error as it stands; one that is not JSON, or that `decode` refuses, is an
 * error naming it (`what`, such as "API key file", then the path) as corrupt, so that it is never
 * silently replaced.
 */
export function readJsonFileSync<T>(file: string, what: string, decode: (json: unknown) => T): T | undefined {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw error;
  }
  try {
    return decode(JSON.parse(text));
  } catch (error) {
    throw new Error(`${what} ${file} is corrupt: ${error instanceof Error ? error.message : String(error)}`);
  }
}
