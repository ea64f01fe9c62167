import { ConfigError } from '@infermesh/config';
import { loadBatcherConfig } from './batcher.config';

describe('loadBatcherConfig', () => {
  it('reads the workers as addresses, one by default', () => {
    expect(loadBatcherConfig({}).workerAddresses).toEqual(['127.0.0.1:50055']);
    expect(loadBatcherConfig({ BATCHER_WORKER_ADDRESSES: 'a:1, b:2' }).workerAddresses).toEqual(['a:1', 'b:2']);
  });

  it('takes the workers from the mesh with "mesh", which needs the control plane', () => {
    expect(
      loadBatcherConfig({ BATCHER_WORKER_ADDRESSES: 'mesh', INFERMESH_MESH_CONTROL_PLANE: '127.0.0.1:50051' })
        .workerAddresses,
    ).toBe('mesh');
    expect(() => loadBatcherConfig({ BATCHER_WORKER_ADDRESSES: 'mesh' })).toThrow(
      /BATCHER_WORKER_ADDRESSES: "mesh" takes the workers from the mesh's control plane: set INFERMESH_MESH_CONTROL_PLANE too/,
    );
  });

  it('names the variable for an address that is neither', () => {
    let error: unknown;
    try {
      loadBatcherConfig({ BATCHER_WORKER_ADDRESSES: 'worker-without-port' });
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(ConfigError);
    expect((error as ConfigError).problems.join('\n')).toMatch(
      /^BATCHER_WORKER_ADDRESSES: .*\(got "worker-without-port"\)/,
    );
  });

  it('picks workers by least outstanding batches unless BATCHER_REPLICA_CHOICE says power_of_two; anything else is refused, naming it', () => {
    expect(loadBatcherConfig({}).replicaChoice).toBe('least_outstanding');
    expect(loadBatcherConfig({ BATCHER_REPLICA_CHOICE: 'power_of_two' }).replicaChoice).toBe('power_of_two');
    expect(() => loadBatcherConfig({ BATCHER_REPLICA_CHOICE: 'random' })).toThrow(
      /BATCHER_REPLICA_CHOICE: expected least_outstanding or power_of_two/,
    );
  });
});
