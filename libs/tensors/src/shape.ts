/** Number of elements of a concrete shape. */
export function elementCount(shape: readonly (bigint | number)[]): number {
  let count = 1;
  for (const dim of shape) count *= Number(dim);
  return count;
}

export function formatShape(shape: readonly (bigint | number)[]): string {
  return `[${shape.map((d) => String(d)).join(',')}]`;
}

/** True when a concrete shape fits a declared one, whose -1 dimensions accept any size. */
export function shapeMatches(declared: readonly (bigint | number)[], actual: readonly (bigint | number)[]): boolean {
  if (declared.length !== actual.length) return false;
  return declared.every((dim, i) => Number(dim) < 0 || Number(dim) === Number(actual[i]));
}
