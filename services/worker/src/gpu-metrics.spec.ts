import { chmodSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { findNvidiaSmi, parseNvidiaSmi } from './gpu-metrics';

describe(parseNvidiaSmi.name, () => {
  it('reads index, name, utilisation (as a ratio) and memory (MiB as bytes) per GPU', () => {
    expect(parseNvidiaSmi('0, NVIDIA H200, 37, 1024, 143771\n1, NVIDIA H200, 0, 0, 143771\n')).toEqual([
      {
        index: '0',
        name: 'NVIDIA H200',
        utilizationRatio: 0.37,
        memoryUsedBytes: 1024 * 2 ** 20,
        memoryTotalBytes: 143771 * 2 ** 20,
      },
      { index: '1', name: 'NVIDIA H200', utilizationRatio: 0, memoryUsedBytes: 0, memoryTotalBytes: 143771 * 2 ** 20 },
    ]);
  });

  it('skips lines with fields nvidia-smi could not read', () => {
    expect(parseNvidiaSmi('0, Tesla T4, [N/A], 10, 15360\n\ngarbage\n')).toEqual([]);
  });
});

describe(findNvidiaSmi.name, () => {
  it('finds an executable nvidia-smi on PATH and nothing where there is none', () => {
    const dir = mkdtempSync(join(tmpdir(), 'nvsmi-'));
    try {
      expect(findNvidiaSmi(dir)).toBeUndefined();
      writeFileSync(join(dir, 'nvidia-smi'), '#!/bin/sh\n');
      chmodSync(join(dir, 'nvidia-smi'), 0o755);
      expect(findNvidiaSmi(`/nonexistent:${dir}`)).toBe(join(dir, 'nvidia-smi'));
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
