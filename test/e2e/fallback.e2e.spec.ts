import { createClient } from '@infermesh/grpc';
import { buildMlpModel, buildTinyModel, mlpLayers, TINY_BIAS, TINY_WEIGHT } from '@infermesh/model-builder';
import { RegistryService } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { API_KEY, type Fixture, startFixture } from './support/system-fixture';

const LOOPS = 4;
const BACKUP = { sizes: [4, 16, 3], seed: 7, name: 'backup' } as const;

interface Answer {
  /** Date.now() when the request was sent and when its answer came. */
  sentAt: number;
  doneAt: number;
  status: number;
  model?: string;
  degraded?: boolean;
  /** Whose weights computed the output: "primary" (the tiny model's), "backup" (the MLP's) or "neither". */
  computedBy?: 'primary' | 'backup' | 'neither';
  error?: string;
}

/** output = input · W + b, the tiny model registered as "primary". */
function primaryOutput(input: readonly number[]): number[] {
  return TINY_BIAS.map((b, j) => input.reduce((sum, x, i) => sum + x * TINY_WEIGHT[i * 3 + j]!, b));
}

/** The MLP registered as "backup": the same signature, other weights. */
function backupOutput(input: readonly number[]): number[] {
  let x = [...input];
  for (const layer of mlpLayers(BACKUP)) {
    const y = Array.from(layer.bias, (b, j) =>
      x.reduce((sum, v, i) => sum + v * layer.weight[i * layer.outFeatures + j]!, b),
    );
    x = layer.relu ? y.map((v) => Math.max(0, v)) : y;
  }
  return x;
}

const close = (a: readonly number[], b: readonly number[]) =>
  a.length === b.length && a.every((v, i) => Math.abs(v - b[i]!) <= 1e-4 * Math.max(1, Math.abs(b[i]!)));

/**
 * Graceful degradation to a fallback model when the primary model's workers die: two workers, worker
 * 0 serving only "primary" and worker 1 only "backup" (WORKER_MODELS), "primary"'s rollout policy
 * naming "backup" as its fallback. A closed-loop client keeps calling "primary" while worker 0 is
 * killed: no request fails, and the answers come from "backup", marked degraded, until worker 0 is
 * back. The router runs with its default settings (retries, circuit breaker, 5 s cool-down).
 */
describe('fallback model when the primary has no worker', () => {
  let fixture: Fixture;

  beforeAll(async () => {
    fixture = await startFixture({
      models: [{ ...buildTinyModel(), name: 'primary' }, buildMlpModel(BACKUP)],
      workers: [{ models: ['primary'] }, { models: ['backup'] }],
    });
    const registry = createClient(RegistryService, fixture.system.grpcAddress('registry'));
    try {
      await registry.setRolloutPolicy(
        { model: 'models/primary', policy: { fallbackModel: 'backup' } },
        { timeoutMs: 5_000 },
      );
    } finally {
      registry.close();
    }
    // The router follows the registry's watch: a change applies within a second.
    await new Promise((r) => setTimeout(r, 1_500));
  });

  afterAll(async () => {
    await fixture?.stop();
  });

  let seq = 0;
  /** One call to "primary" with an input never sent before, so that no cache answers it. */
  async function infer(): Promise<Answer> {
    seq += 1;
    const input = [seq / 1000, 1, -2, 0.5];
    const sentAt = Date.now();
    try {
      const res = await fetch(`${fixture.system.gatewayUrl}/v2/models/primary/infer`, {
        method: 'POST',
        headers: { authorization: `Bearer ${API_KEY}`, 'content-type': 'application/json' },
        body: JSON.stringify({ inputs: [{ name: 'input', shape: [1, 4], datatype: 'FP32', data: input }] }),
        signal: AbortSignal.timeout(20_000),
      });
      const body = (await res.json()) as {
        error?: string;
        model_name?: string;
        parameters?: { degraded?: boolean };
        outputs?: { data: number[] }[];
      };
      const output = body.outputs?.[0]?.data ?? [];
      const computedBy = close(output, primaryOutput(input))
        ? 'primary'
        : close(output, backupOutput(input))
          ? 'backup'
          : 'neither';
      return {
        sentAt,
        doneAt: Date.now(),
        status: res.status,
        ...(body.model_name !== undefined && { model: body.model_name }),
        ...(body.parameters?.degraded !== undefined && { degraded: body.parameters.degraded }),
        computedBy,
        ...(body.error !== undefined && { error: body.error }),
      };
    } catch (error) {
      return { sentAt, doneAt: Date.now(), status: 0, error: error instanceof Error ? error.message : String(error) };
    }
  }

  /** LOOPS closed loops calling "primary" until stop() resolves; returns every answer. */
  function closedLoop(): { stop: () => Promise<Answer[]> } {
    const answers: Answer[] = [];
    let running = true;
    const loops = Array.from({ length: LOOPS }, async () => {
      while (running) answers.push(await infer());
    });
    return {
      stop: async () => {
        running = false;
        await Promise.all(loops);
        return answers;
      },
    };
  }

  const summary = (answers: Answer[]) =>
    answers.map(
      (a) =>
        `${a.status} ${a.model ?? '-'} degraded=${a.degraded ?? '-'} computed by ${a.computedBy ?? '-'}${a.error === undefined ? '' : ` (${a.error})`}`,
    );
  const servedBy = (answers: Answer[], model: string, degraded: boolean) =>
    answers.filter((a) => a.status === 200 && a.model === model && a.degraded === degraded && a.computedBy === model)
      .length;

  it("answers from the fallback, marked degraded, while the primary's only worker is dead, with no failed request; the primary answers again once its worker is back", async () => {
    const client = closedLoop();
    await new Promise((r) => setTimeout(r, 2_000));
    const killStartedAt = Date.now();
    await fixture.system.workerProcess(0).kill();
    const killedAt = Date.now();
    await new Promise((r) => setTimeout(r, 5_000));
    const answers = await client.stop();

    const before = answers.filter((a) => a.doneAt < killStartedAt);
    const across = answers.filter((a) => a.doneAt >= killStartedAt && a.sentAt <= killedAt);
    const after = answers.filter((a) => a.sentAt > killedAt);
    const failed = answers.filter((a) => a.status !== 200);
    console.log(
      [
        `fallback: ${answers.length} requests over ${LOOPS} loops, ${failed.length} failed`,
        `  before the kill: ${before.length} (${servedBy(before, 'primary', false)} from primary, not degraded)`,
        `  in flight at the kill: ${across.length} (${servedBy(across, 'primary', false)} from primary, ${servedBy(across, 'backup', true)} from backup, degraded)`,
        `  after the kill: ${after.length} (${servedBy(after, 'backup', true)} from backup, degraded)`,
      ].join('\n'),
    );
    expect(summary(failed)).toEqual([]);
    expect(before.length).toBeGreaterThan(0);
    expect(after.length).toBeGreaterThan(0);
    expect(servedBy(before, 'primary', false)).toBe(before.length);
    expect(servedBy(across, 'primary', false) + servedBy(across, 'backup', true)).toBe(across.length);
    expect(servedBy(after, 'backup', true)).toBe(after.length);

    // Worker 0 back: "primary" answers again, not degraded, once the batcher sees it and the router's
    // circuit for it closes (its cool-down is 5 s); meanwhile the fallback still answers.
    const restartedAt = Date.now();
    await fixture.system.restartWorker(0);
    const meanwhile: Answer[] = [];
    for (;;) {
      const answer = await infer();
      meanwhile.push(answer);
      if (answer.status === 200 && answer.model === 'primary') break;
      if (Date.now() - restartedAt > 60_000) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    const recovered = [];
    for (let i = 0; i < 20; i++) recovered.push(await infer());
    console.log(
      `fallback: worker 0 restarted; primary answered again after ${((meanwhile.at(-1)!.doneAt - restartedAt) / 1000).toFixed(1)} s ` +
        `(${meanwhile.length - 1} requests answered by backup, degraded, meanwhile), then ${servedBy(recovered, 'primary', false)} of ${recovered.length} from primary, not degraded`,
    );
    expect(
      summary(
        meanwhile
          .slice(0, -1)
          .filter(
            (a) => !(a.status === 200 && a.model === 'backup' && a.degraded === true && a.computedBy === 'backup'),
          ),
      ),
    ).toEqual([]);
    expect(summary(meanwhile.slice(-1))).toEqual(['200 primary degraded=false computed by primary']);
    expect(servedBy(recovered, 'primary', false)).toBe(recovered.length);
  });
});
