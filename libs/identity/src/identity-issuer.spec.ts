import { createPrivateKey, X509Certificate } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { eventually, ManualClock } from '@infermesh/testing';
import { identityPaths } from './identity-files';
import { type IdentityIssuedEvent, type IdentityIssueFailedEvent, IdentityIssuer } from './identity-issuer';
import { type CertificateAuthority, type IssuedIdentity, LocalCa, type ServiceIdentity } from './local-ca';
import { readIdentity } from './read-identity';

const HOUR_MS = 3600 * 1000;

/** The real local CA, made to fail its next `failures` issues: an outage of the CA. */
class FlakyCa implements CertificateAuthority {
  failures = 0;
  issues = 0;

  constructor(private readonly ca: LocalCa) {}

  get bundlePem(): string {
    return this.ca.bundlePem;
  }

  async issue(identity: ServiceIdentity, lifetimeMs: number): Promise<IssuedIdentity> {
    this.issues += 1;
    if (this.failures > 0) {
      this.failures -= 1;
      throw new Error('CA unavailable');
    }
    return this.ca.issue(identity, lifetimeMs);
  }
}

/** Events in arrival order, awaited one at a time. */
class Events<E> {
  private readonly queued: E[] = [];
  private waiting: ((event: E) => void) | undefined;

  readonly push = (event: E): void => {
    if (this.waiting === undefined) this.queued.push(event);
    else {
      const resolve = this.waiting;
      this.waiting = undefined;
      resolve(event);
    }
  };

  async next(timeoutMs = 5_000): Promise<E> {
    const queued = this.queued.shift();
    if (queued !== undefined) return queued;
    return new Promise<E>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`no event in ${timeoutMs} ms`)), timeoutMs);
      this.waiting = (event) => {
        clearTimeout(timer);
        resolve(event);
      };
    });
  }

  get count(): number {
    return this.queued.length;
  }
}

function serialIn(dir: string): string {
  return new X509Certificate(readFileSync(identityPaths(dir).certFile)).serialNumber;
}

describe(IdentityIssuer.name, () => {
  let root: string;
  let ca: LocalCa;
  let sut: IdentityIssuer | undefined;

  beforeAll(async () => {
    root = mkdtempSync(join(tmpdir(), 'identity-issuer-'));
    ca = await LocalCa.open(join(root, 'ca'));
  });

  afterEach(() => {
    sut?.stop();
    sut = undefined;
  });

  afterAll(() => {
    rmSync(root, { recursive: true, force: true });
  });

  it("writes the instance's files under the root and tells of it", async () => {
    const issued = new Events<IdentityIssuedEvent>();
    sut = new IdentityIssuer({ ca, rootDir: join(root, 'written'), onIssued: issued.push });

    const dir = await sut.ensure({ service: 'worker', instance: 'worker-3' });

    expect(dir).toBe(join(root, 'written', 'worker-3'));
    await expect(readIdentity(dir)).resolves.toMatchObject({
      service: 'worker',
      spiffeId: 'spiffe://infermesh.local/worker',
    });
    const event = await issued.next();
    expect(event).toMatchObject({
      dir,
      rotated: false,
      spiffeId: 'spiffe://infermesh.local/worker',
      serialNumber: serialIn(dir),
    });
    // Four hours by default, renewed half-way.
    expect(event.notAfter.getTime() - Date.now()).toBeGreaterThan(4 * HOUR_MS - 2000);
    expect(event.renewAt.getTime() - Date.now()).toBeGreaterThan(2 * HOUR_MS - 2000);
    expect(event.renewAt.getTime() - Date.now()).toBeLessThanOrEqual(2 * HOUR_MS);
  });

  it('replaces the files before they expire, again and again', async () => {
    const clock = new ManualClock(Date.now());
    // A CA that dates certificates by the same clock, so that expiry is on it too.
    const caOnClock = await LocalCa.open(join(root, 'ca-on-clock'), { now: () => clock.date() });
    const issued = new Events<IdentityIssuedEvent>();
    sut = new IdentityIssuer({
      ca: caOnClock,
      rootDir: join(root, 'again'),
      lifetimeMs: 2000,
      clock,
      onIssued: issued.push,
    });
    const dir = await sut.ensure({ service: 'router', instance: 'router' });
    const first = await issued.next();

    clock.advance(clock.pendingInMs()[0]!);
    const second = await issued.next();
    const replacedAt = clock.now();
    clock.advance(clock.pendingInMs()[0]!);
    const third = await issued.next();

    for (const rotation of [second, third]) expect(rotation.rotated).toBe(true);
    expect(replacedAt).toBeLessThan(first.notAfter.getTime());
    expect(second.notAfter.getTime()).toBeGreaterThan(first.notAfter.getTime());
    expect(new Set([first.serialNumber, second.serialNumber, third.serialNumber]).size).toBe(3);
    const info = await readIdentity(dir);
    expect([second.notAfter.getTime(), third.notAfter.getTime()]).toContain(info.notAfter.getTime());
    const leaf = new X509Certificate(readFileSync(identityPaths(dir).certFile));
    expect(leaf.checkPrivateKey(createPrivateKey(readFileSync(identityPaths(dir).keyFile)))).toBe(true);
  });

  it('issues again at half-life', async () => {
    const clock = new ManualClock(Date.now());
    const issued = new Events<IdentityIssuedEvent>();
    sut = new IdentityIssuer({ ca, rootDir: join(root, 'half-life'), clock, onIssued: issued.push });
    const dir = await sut.ensure({ service: 'cache', instance: 'cache-0' });
    const first = await issued.next();
    const [renewInMs] = clock.pendingInMs();
    expect(clock.pendingInMs()).toHaveLength(1);
    expect(renewInMs).toBe(first.renewAt.getTime() - clock.now());

    clock.advance(renewInMs! - 1);
    expect(issued.count).toBe(0);
    clock.advance(1);
    const second = await issued.next();

    expect(second.rotated).toBe(true);
    expect(serialIn(dir)).toBe(second.serialNumber);
    expect(second.serialNumber).not.toBe(first.serialNumber);
    expect(clock.pendingInMs()).toHaveLength(1);
  });

  it('reports a failed rotation and retries it with capped exponential back-off until it succeeds', async () => {
    const clock = new ManualClock(Date.now());
    const flaky = new FlakyCa(ca);
    const issued = new Events<IdentityIssuedEvent>();
    const failed = new Events<IdentityIssueFailedEvent>();
    sut = new IdentityIssuer({
      ca: flaky,
      rootDir: join(root, 'flaky'),
      clock,
      onIssued: issued.push,
      onError: failed.push,
      retryMaxMs: 1500,
    });
    const dir = await sut.ensure({ service: 'batcher', instance: 'batcher-0' });
    const first = await issued.next();
    flaky.failures = 3;

    clock.advance(clock.pendingInMs()[0]!);
    expect(await failed.next()).toMatchObject({
      failures: 1,
      retryInMs: 1000,
      dir,
      identity: { service: 'batcher', instance: 'batcher-0' },
    });
    expect(clock.pendingInMs()).toEqual([1000]);
    clock.advance(1000);
    expect(await failed.next()).toMatchObject({ failures: 2, retryInMs: 1500 });
    clock.advance(1500);
    const third = await failed.next();
    expect(third).toMatchObject({ failures: 3, retryInMs: 1500 });
    expect(String(third.error)).toContain('CA unavailable');
    expect(serialIn(dir)).toBe(first.serialNumber);
    clock.advance(1500);
    const rotated = await issued.next();

    expect(rotated.rotated).toBe(true);
    expect(serialIn(dir)).toBe(rotated.serialNumber);
    expect(flaky.issues).toBe(5);
    // A later failure starts the back-off again from its first step.
    flaky.failures = 1;
    clock.advance(clock.pendingInMs()[0]!);
    expect(await failed.next()).toMatchObject({ failures: 1, retryInMs: 1000 });
  });

  it('rejects ensure when the first issue fails, and keeps nothing', async () => {
    const clock = new ManualClock(Date.now());
    const flaky = new FlakyCa(ca);
    flaky.failures = 1;
    sut = new IdentityIssuer({ ca: flaky, rootDir: join(root, 'first-fails'), clock });

    await expect(sut.ensure({ service: 'gateway', instance: 'gateway' })).rejects.toThrow('CA unavailable');

    expect(clock.pendingInMs()).toEqual([]);
    // Asking again tries again.
    await expect(sut.ensure({ service: 'gateway', instance: 'gateway' })).resolves.toBe(
      join(root, 'first-fails', 'gateway'),
    );
  });

  it('keeps one identity per instance', async () => {
    const flaky = new FlakyCa(ca);
    sut = new IdentityIssuer({ ca: flaky, rootDir: join(root, 'once'), clock: new ManualClock(Date.now()) });

    const dirs = await Promise.all([
      sut.ensure({ service: 'worker', instance: 'worker-0' }),
      sut.ensure({ service: 'worker', instance: 'worker-0' }),
    ]);
    await sut.ensure({ service: 'worker', instance: 'worker-0' });

    expect(dirs[0]).toBe(dirs[1]);
    expect(flaky.issues).toBe(1);
    await expect(sut.ensure({ service: 'router', instance: 'worker-0' })).rejects.toThrow(
      'instance worker-0 is already the identity of service worker, not router',
    );
  });

  it('stops rotating on stop and on release', async () => {
    const clock = new ManualClock(Date.now());
    const flaky = new FlakyCa(ca);
    sut = new IdentityIssuer({ ca: flaky, rootDir: join(root, 'stopped'), clock });
    await sut.ensure({ service: 'worker', instance: 'worker-0' });
    await sut.ensure({ service: 'worker', instance: 'worker-1' });
    expect(clock.pendingInMs()).toHaveLength(2);

    sut.release('worker-0');
    expect(clock.pendingInMs()).toHaveLength(1);
    sut.stop();

    expect(clock.pendingInMs()).toEqual([]);
    clock.advance(5 * HOUR_MS);
    expect(flaky.issues).toBe(2);
    await expect(sut.ensure({ service: 'worker', instance: 'worker-2' })).rejects.toThrow(
      'the identity issuer is stopped',
    );
  });

  it('keeps rotating when the listener throws', async () => {
    const clock = new ManualClock(Date.now());
    const flaky = new FlakyCa(ca);
    sut = new IdentityIssuer({
      ca: flaky,
      rootDir: join(root, 'listener-throws'),
      clock,
      onIssued: () => {
        throw new Error('logger down');
      },
    });

    const dir = await sut.ensure({ service: 'worker', instance: 'worker-0' });
    const serial = serialIn(dir);
    clock.advance(clock.pendingInMs()[0]!);
    await eventually(() => clock.pendingInMs().length === 1);

    expect(flaky.issues).toBe(2);
    expect(serialIn(dir)).not.toBe(serial);
    expect(clock.pendingInMs()).toHaveLength(1);
  });

  it('refuses an instance name that is not a folder name', async () => {
    sut = new IdentityIssuer({ ca, rootDir: join(root, 'names') });

    await expect(sut.ensure({ service: 'worker', instance: '../escape' })).rejects.toThrow(/invalid instance name/);
  });
});
