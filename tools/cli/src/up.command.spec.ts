import { UsageError } from './cli-errors';
import { upOptions } from './up.command';
import { runCapturing } from './testing/cli-runner';

describe('upOptions', () => {
  it('is one worker without --replicas, and as many as asked with worker=n', () => {
    expect(upOptions(undefined)).toEqual({ workers: 1, replicas: {} });
    expect(upOptions('worker=2')).toEqual({ workers: 2, replicas: {} });
    expect(upOptions('worker=3,router=1')).toEqual({ workers: 3, replicas: { router: 1 } });
  });

  it('takes replicas of the router, batcher and cache in the mesh (the default)', () => {
    expect(upOptions('router=2,batcher=3,cache=2,worker=2')).toEqual({
      workers: 2,
      replicas: { router: 2, batcher: 3, cache: 2 },
    });
  });

  it.each([
    [
      'router=2',
      '--replicas: router replicas need the mesh, through which their callers reach every instance: set INFERMESH_MESH=xds',
    ],
    ['gateway=2', '--replicas: gateway run once on one machine'],
    ['worker=0', '--replicas "worker=0": the count must be an integer of at least 1, got "0"'],
    ['worker=9', '--replicas "worker=9": at most 8 instances of a service on one machine'],
    [
      'workers=2',
      '--replicas "workers=2": workers is not a service (registry, cache, worker, batcher, router, gateway)',
    ],
    ['worker=2,worker=3', '--replicas: worker is named twice'],
    ['worker', '--replicas must look like key=value, got "worker"'],
    [',', '--replicas must look like worker=2, got ","'],
  ])('refuses --replicas %s as a usage error naming what is wrong', (value, message) => {
    let error: unknown;
    try {
      upOptions(value, 'static');
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(UsageError);
    expect((error as Error).message).toContain(message);
  });

  it('is what `infermesh up --replicas` reads: a bad value exits 2 before anything starts', async () => {
    const run = await runCapturing(['up', '--replicas', 'batcher=2'], { INFERMESH_MESH: 'static' });

    expect(run.code).toBe(2);
    expect(run.stderr).toContain('--replicas: batcher replicas need the mesh');
  });
});
