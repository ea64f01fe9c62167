import { SERVICE_NAMES } from '@infermesh/system';
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { delimiter, join } from 'node:path';
import { type Fixture, inferTinyDistinct, REPO_ROOT, runCli, startFixture } from './support/system-fixture';

/**
 * The Kubernetes autoscalers (k8s/components/keda, hpa, gpu) read metrics by name: each must be one
 * the running services expose. The worker runs with an nvidia-smi on its PATH that reports one GPU
 * (no GPU here): its GPU gauges are the worker's own code reading that tool's CSV, as on a GPU node.
 */
describe('the metrics the Kubernetes autoscalers read, against the running services', () => {
  let fixture: Fixture;
  let fakeGpu: string;
  let urls: string;

  beforeAll(async () => {
    fakeGpu = mkdtempSync(join(tmpdir(), 'infermesh-fake-gpu-'));
    const smi = join(fakeGpu, 'nvidia-smi');
    writeFileSync(smi, '#!/bin/sh\necho "0, NVIDIA L4, 37, 1024, 23034"\n');
    chmodSync(smi, 0o755);
    fixture = await startFixture({
      models: ['tiny'],
      workers: [
        { env: { PATH: `${fakeGpu}${delimiter}${process.env['PATH'] ?? ''}`, WORKER_GPU_METRICS_INTERVAL_MS: '200' } },
      ],
    });
    // A few requests, so that the batcher has had a queue.
    for (let i = 0; i < 5; i += 1) expect(await inferTinyDistinct(fixture.system.gatewayUrl)).toBe(200);
    urls = SERVICE_NAMES.map((s) => fixture.system.metricsUrl(s)).join(',');
  }, 120_000);

  afterAll(async () => {
    await fixture?.stop();
    rmSync(fakeGpu, { recursive: true, force: true });
  });

  it("every metric of every shipped overlay's autoscalers (KEDA, GPU use) and of the HPA component is exposed", async () => {
    const hpa = join(REPO_ROOT, 'k8s', 'testdata', 'hpa');
    const shipped = await runCli(['k8s', 'check', '--metrics', urls], '127.0.0.1:1');
    const withHpa = await runCli(['k8s', 'check', hpa, '--metrics', urls], '127.0.0.1:1');

    expect(shipped.stderr).toBe('');
    expect(shipped.stdout).toContain('k8s/overlays/gpu: ok');
    expect({ code: shipped.code, stderr: shipped.stderr }).toEqual({ code: 0, stderr: '' });
    expect(withHpa.stdout).toContain('ok (');
    expect(withHpa.code).toBe(0);
  }, 120_000);

  it('an autoscaler on a metric no service exposes fails the check, naming it', async () => {
    const broken = join(REPO_ROOT, 'k8s', 'testdata', 'broken-live', 'unknown-metric');

    const run = await runCli(['k8s', 'check', broken, '--production', '--metrics', urls], '127.0.0.1:1');

    expect(run.code).toBe(1);
    expect(run.stdout).toContain(
      'ScaledObject/batcher: reads infermesh_batcher_queue_length, which none of the scraped services exposes',
    );
    // The same overlay without --metrics passes: only the running services know their metrics.
    expect((await runCli(['k8s', 'check', broken, '--production'], '127.0.0.1:1')).code).toBe(0);
  }, 120_000);
});
