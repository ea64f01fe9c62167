import { ManualClock } from '@infermesh/testing';
import type { MeshInstance } from '@infermesh/mesh';
import { MeshInstances } from './mesh-instances';

const router = (id: string, port = 50052): MeshInstance => ({
  service: 'router',
  id,
  address: '127.0.0.1',
  port,
  labels: {},
  healthy: true,
});

describe(MeshInstances.name, () => {
  let clock: ManualClock;
  let changes: number;
  let sut: MeshInstances;

  beforeEach(() => {
    clock = new ManualClock(1_000);
    changes = 0;
    sut = new MeshInstances(5_000, clock);
    sut.onChange(() => (changes += 1));
  });

  it('lists announced instances until their announcement ends, and says so at each change', () => {
    const a = sut.announce(router('router-0'));
    sut.announce(router('router-1', 50062));

    expect(sut.list().map((i) => i.id)).toEqual(['router-0', 'router-1']);
    sut.withdraw('router-0', a);
    expect(sut.list().map((i) => i.id)).toEqual(['router-1']);
    expect(changes).toBe(3);
  });

  it('takes a heartbeat that says not serving as a change of health, and one that repeats it as nothing new', () => {
    const token = sut.announce(router('router-0'));

    sut.heartbeat('router-0', token, false);
    sut.heartbeat('router-0', token, false);

    expect(sut.list()[0]!.healthy).toBe(false);
    expect(changes).toBe(2);
  });

  it('keeps a newer announcement of the same id when the older one ends (a restarted instance)', () => {
    const old = sut.announce(router('router-0'));
    sut.announce(router('router-0', 50099));

    sut.withdraw('router-0', old);
    sut.heartbeat('router-0', old, false);

    expect(sut.list()).toEqual([router('router-0', 50099)]);
  });

  it('withdraws an instance silent for longer than the timeout, and keeps one that sends heartbeats', () => {
    const a = sut.announce(router('router-0'));
    sut.announce(router('router-1'));
    clock.advance(4_000);
    sut.heartbeat('router-0', a, true);
    clock.advance(2_000);

    expect(sut.sweep()).toBe(true);
    expect(sut.list().map((i) => i.id)).toEqual(['router-0']);
    expect(sut.sweep()).toBe(false);
  });
});
