/** A loaded model version that could be evicted: idle and not pinned. */
export interface EvictionCandidate {
  name: string;
  memoryBytes: number;
  lastUsedMs: number;
}

/**
 * The candidates to evict, least recently used first, so that `neededBytes` more fit in
 * `budgetBytes` when `usedBytes` are charged now: none when it fits already, undefined when evicting
 * every candidate is still not enough.
 */
export function chooseEvictions(
  candidates: readonly EvictionCandidate[],
  usedBytes: number,
  neededBytes: number,
  budgetBytes: number,
): EvictionCandidate[] | undefined {
  let excess = usedBytes + neededBytes - budgetBytes;
  if (excess <= 0) return [];
  const chosen: EvictionCandidate[] = [];
  for (const candidate of [...candidates].sort((a, b) => a.lastUsedMs - b.lastUsedMs)) {
    chosen.push(candidate);
    excess -= candidate.memoryBytes;
    if (excess <= 0) return chosen;
  }
  return undefined;
}

/** "1.5 GiB", "24.0 MiB", "512 B": a size for messages. */
export function formatBytes(bytes: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = bytes;
  let unit = 0;
  while (Math.abs(value) >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return unit === 0 ? `${value} B` : `${value.toFixed(1)} ${units[unit]}`;
}
