import { Inject, Injectable, type OnApplicationBootstrap, type OnApplicationShutdown } from '@nestjs/common';
import { Clock } from '@infermesh/clock';
import { JsonLogger, Metrics } from '@infermesh/telemetry';
import { execFile } from 'node:child_process';
import { accessSync, constants } from 'node:fs';
import { delimiter, join } from 'node:path';
import type { Gauge } from 'prom-client';
import { WORKER_CONFIG, type WorkerConfig } from './worker.config';

/** One GPU as nvidia-smi reports it. */
export interface GpuSample {
  index: string;
  name: string;
  utilizationRatio: number;
  memoryUsedBytes: number;
  memoryTotalBytes: number;
}

/** The fields asked of nvidia-smi, in the order parseNvidiaSmi reads them. */
export const NVIDIA_SMI_ARGS = [
  '--query-gpu=index,name,utilization.gpu,memory.used,memory.total',
  '--format=csv,noheader,nounits',
];

/** nvidia-smi's CSV (see NVIDIA_SMI_ARGS) as samples; lines it cannot read ("[N/A]") are skipped. */
export function parseNvidiaSmi(csv: string): GpuSample[] {
  const samples: GpuSample[] = [];
  for (const line of csv.split('\n')) {
    const fields = line.split(',').map((f) => f.trim());
    if (fields.length !== 5) continue;
    const [index, name, utilization, used, total] = fields as [string, string, string, string, string];
    const numbers = [utilization, used, total].map(Number);
    if (index === '' || numbers.some((n) => !Number.isFinite(n))) continue;
    samples.push({
      index,
      name,
      utilizationRatio: numbers[0]! / 100,
      memoryUsedBytes: numbers[1]! * 2 ** 20, // MiB
      memoryTotalBytes: numbers[2]! * 2 ** 20,
    });
  }
  return samples;
}

/** The nvidia-smi executable on PATH, or undefined on a host without NVIDIA's driver tools. */
export function findNvidiaSmi(path = process.env['PATH'] ?? ''): string | undefined {
  for (const dir of path.split(delimiter)) {
    if (dir === '') continue;
    const candidate = join(dir, 'nvidia-smi');
    try {
      accessSync(candidate, constants.X_OK);
      return candidate;
    } catch {
      // not here
    }
  }
  return undefined;
}

/**
 * GPU utilisation and memory as gauges, sampled from nvidia-smi every WORKER_GPU_METRICS_INTERVAL_MS
 * where it is installed; on a host without it the gauges are not exported and nothing runs.
 */
@Injectable()
export class GpuMetrics implements OnApplicationBootstrap, OnApplicationShutdown {
  private stopTimer: (() => void) | undefined;
  private readonly executable = findNvidiaSmi();
  private gauges:
    { utilization: Gauge<'gpu' | 'name'>; used: Gauge<'gpu' | 'name'>; total: Gauge<'gpu' | 'name'> } | undefined;
  private failing = false;

  constructor(
    @Inject(WORKER_CONFIG) private readonly config: WorkerConfig,
    private readonly metrics: Metrics,
    private readonly logger: JsonLogger,
    private readonly clock: Clock,
  ) {}

  onApplicationBootstrap(): void {
    if (this.executable === undefined) return;
    const labels = ['gpu', 'name'] as const;
    this.gauges = {
      utilization: this.metrics.gauge(
        'gpu_utilization_ratio',
        'GPU utilisation over the last sample period, 0 to 1 (nvidia-smi).',
        labels,
      ),
      used: this.metrics.gauge('gpu_memory_used_bytes', 'GPU memory in use (nvidia-smi).', labels),
      total: this.metrics.gauge('gpu_memory_total_bytes', 'GPU memory in all (nvidia-smi).', labels),
    };
    this.sample();
    this.stopTimer = this.clock.setRepeatingTimer(() => this.sample(), this.config.gpuMetricsIntervalMs);
  }

  onApplicationShutdown(): void {
    this.stopTimer?.();
  }

  private sample(): void {
    execFile(this.executable!, NVIDIA_SMI_ARGS, { timeout: 5_000 }, (error, stdout) => {
      if (error !== null) {
        if (!this.failing) this.logger.warn('nvidia-smi failed; GPU gauges are stale', { err: error.message });
        this.failing = true;
        return;
      }
      this.failing = false;
      for (const gpu of parseNvidiaSmi(stdout)) {
        const labels = { gpu: gpu.index, name: gpu.name };
        this.gauges!.utilization.set(labels, gpu.utilizationRatio);
        this.gauges!.used.set(labels, gpu.memoryUsedBytes);
        this.gauges!.total.set(labels, gpu.memoryTotalBytes);
      }
    });
  }
}
