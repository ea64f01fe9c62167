/**
 * The value at a path such as `static_resources.listeners[2].name` in a JSON document, for specs
 * that look into generated configurations; throws naming the path when a step is missing.
 */
export function at(document: unknown, path: string): unknown {
  let value = document;
  for (const step of path.match(/[^.[\]]+/g) ?? []) {
    if (typeof value !== 'object' || value === null || !(step in value)) throw new Error(`${path}: nothing at ${step}`);
    value = (value as Record<string, unknown>)[step];
  }
  return value;
}

/** The list at a path. */
export function listAt(document: unknown, path: string): unknown[] {
  const value = at(document, path);
  if (!Array.isArray(value)) throw new Error(`${path}: not a list`);
  return value;
}

/** The item of the list at `path` whose `name` is `name`. */
export function named(document: unknown, path: string, name: string): unknown {
  const item = listAt(document, path).find((entry) => (entry as { name?: unknown }).name === name);
  if (item === undefined) throw new Error(`${path}: nothing named ${name}`);
  return item;
}
