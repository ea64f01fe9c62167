import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseDocument } from 'yaml';
import { BURN_RATE_ALERTS, burnRate, errorBudget, parseSloSpec, SloSpecError } from './slo-spec';

const SHIPPED = readFileSync(join(__dirname, '..', '..', '..', 'grafana', 'slo', 'slos.yaml'), 'utf8');

type Change = [path: (string | number)[], value: unknown];

/** The shipped spec with values set at paths (undefined removes). */
function changed(...changes: Change[]): string {
  const doc = parseDocument(SHIPPED);
  for (const [path, value] of changes) {
    if (value === undefined) doc.deleteIn(path);
    else doc.setIn(path, doc.createNode(value));
  }
  return doc.toString();
}

function problemsOf(text: string): readonly string[] {
  try {
    parseSloSpec(text, 'test.yaml');
  } catch (error) {
    if (error instanceof SloSpecError) return error.problems;
    throw error;
  }
  throw new Error('the spec was accepted');
}

describe('parseSloSpec', () => {
  it('accepts the shipped grafana/slo/slos.yaml: all, each model, and classifier, availability and latency each', () => {
    const sut = parseSloSpec(SHIPPED);

    expect(sut.windowMs).toBe(30 * 86_400_000);
    expect(sut.errorOutcomes).toEqual([
      'unavailable',
      'internal',
      'unknown',
      'data_loss',
      'deadline_exceeded',
      'resource_exhausted',
      'overloaded',
    ]);
    expect(sut.slos.map((s) => s.id)).toEqual([
      'all-availability',
      'all-latency',
      'each-model-availability',
      'each-model-latency',
      'model-classifier-availability',
      'model-classifier-latency',
    ]);
    expect(sut.slos[3]).toMatchObject({
      scope: { kind: 'eachModel', except: ['classifier'] },
      target: { objective: 99, threshold: 0.25 },
    });
    expect(sut.slos[5]).toMatchObject({
      scope: { kind: 'model', model: 'classifier' },
      target: { objective: 99, threshold: 0.1 },
    });
    expect(sut.alerts).toEqual({
      jobPrefix: 'infermesh-',
      serviceDown: { forMs: 120_000 },
      noWorkerReachable: { forMs: 60_000 },
      queueNearBound: { bound: 1000, percent: 80, forMs: 300_000 },
      queueFull: { forMs: 300_000 },
      circuitOpen: { forMs: 300_000 },
      registryWatchDisconnected: { afterMs: 300_000 },
      workerMemoryBudget: { percent: 95, forMs: 900_000 },
    });
  });

  it("has the SRE workbook's burn rates over 30 days: page at 14.4× (1h, 5m) and 6× (6h, 30m), ticket at 3× (1d, 2h) and 1× (3d, 6h)", () => {
    const days30 = 30 * 86_400_000;

    expect(BURN_RATE_ALERTS.map((a) => [a.severity, a.longWindow, a.shortWindow, burnRate(days30, a)])).toEqual([
      ['page', '1h', '5m', 14.4],
      ['page', '6h', '30m', 6],
      ['ticket', '1d', '2h', 3],
      ['ticket', '3d', '6h', 1],
    ]);
    expect(burnRate(28 * 86_400_000, BURN_RATE_ALERTS[0])).toBe(13.44);
    expect([errorBudget(99.5), errorBudget(99.9), errorBudget(99)]).toEqual([0.005, 0.001, 0.01]);
  });

  it('gives a model that names one SLI the other of eachModel, and leaves it out of eachModel', () => {
    const sut = parseSloSpec(
      changed(
        [['objectives', 'models', 'classifier', 'latency'], undefined],
        [['objectives', 'models', 'multi-io'], { latency: { objective: 99.9, threshold: '1s' } }],
      ),
    );

    expect(sut.slos.filter((s) => s.scope.kind === 'model').map((s) => [s.id, s.target])).toEqual([
      ['model-classifier-availability', { objective: 99.9 }],
      ['model-classifier-latency', { objective: 99, threshold: 0.25 }],
      ['model-multi-io-availability', { objective: 99.5 }],
      ['model-multi-io-latency', { objective: 99.9, threshold: 1 }],
    ]);
    expect(sut.slos.find((s) => s.scope.kind === 'eachModel')?.scope).toEqual({
      kind: 'eachModel',
      except: ['classifier', 'multi-io'],
    });
  });

  it.each<[string, Change[], string]>([
    [
      'a latency threshold between buckets',
      [[['objectives', 'all', 'latency', 'threshold'], '300ms']],
      'objectives.all.latency.threshold: 300 ms is not a bucket bound of the latency histograms',
    ],
    [
      'a threshold without unit',
      [[['objectives', 'eachModel', 'latency', 'threshold'], 250]],
      'objectives.eachModel.latency.threshold: expected a duration with its unit',
    ],
    [
      'an objective of 100 %',
      [[['objectives', 'all', 'availability', 'objective'], 100]],
      'objectives.all.availability.objective: must be below 100',
    ],
    [
      'an objective as text',
      [[['objectives', 'all', 'availability', 'objective'], '99.5%']],
      'objectives.all.availability.objective: Invalid input: expected number',
    ],
    [
      'an objective whose fast burn could never fire',
      [[['objectives', 'models', 'classifier', 'availability', 'objective'], 90]],
      'objectives.models.classifier.availability.objective: an objective of 90 % over 30d',
    ],
    [
      'an unknown field',
      [[['objectives', 'all', 'availability', 'target'], 99]],
      'objectives.all.availability: Unrecognized key: "target"',
    ],
    [
      'an objective naming no SLI',
      [[['objectives', 'models', 'classifier'], {}]],
      'objectives.models.classifier: names no objective',
    ],
    [
      'an outcome the gateway never counts',
      [[['sli', 'availability', 'errorOutcomes', 1], 'timeout']],
      'sli.availability.errorOutcomes[1]: the gateway counts no outcome "timeout"',
    ],
    [
      'a success as an error',
      [[['sli', 'availability', 'errorOutcomes', 0], 'degraded']],
      'sli.availability.errorOutcomes[0]: "degraded" is an answer',
    ],
    [
      'an outcome twice',
      [[['sli', 'availability', 'errorOutcomes', 1], 'unavailable']],
      'sli.availability.errorOutcomes[1]: "unavailable" is listed twice',
    ],
    ['no error outcome', [[['sli', 'availability', 'errorOutcomes'], []]], 'sli.availability.errorOutcomes: Too small'],
    [
      'a model that is no model id',
      [[['objectives', 'models', 'a/b'], { availability: { objective: 99 } }]],
      'objectives.models.a/b: not a model id',
    ],
    [
      'two models with the same alert names',
      [
        [['objectives', 'models', 'multi-io'], { availability: { objective: 99 } }],
        [['objectives', 'models', 'multi_io'], { availability: { objective: 99 } }],
      ],
      'objectives.models.multi_io: its alerts would be named InfermeshModelMultiIo*',
    ],
    ['a window shorter than a week', [[['window'], '3d']], 'window: must be at least 7d'],
    [
      'a `for` in fractions of a second',
      [[['alerts', 'circuitOpen', 'for'], '1500ms']],
      'alerts.circuitOpen.for: must be a whole number of seconds',
    ],
    [
      'a missing alert setting',
      [[['alerts', 'queueNearBound', 'bound'], undefined]],
      'alerts.queueNearBound.bound: Invalid input: expected number',
    ],
    ['no objective at all', [[['objectives'], {}]], 'objectives: names no objective'],
  ])('refuses %s, naming the field', (_what, changes, problem) => {
    expect(problemsOf(changed(...changes)).join('\n')).toContain(problem);
  });

  it('lists every problem at once', () => {
    const problems = problemsOf(
      changed(
        [['window'], 'a month'],
        [['alerts', 'serviceDown'], undefined],
        [['objectives', 'all', 'latency', 'objective'], 0],
      ),
    );

    expect(problems).toEqual([
      expect.stringMatching(/^window: expected a duration/),
      expect.stringMatching(/^objectives\.all\.latency\.objective: must be above 0/),
      expect.stringMatching(/^alerts\.serviceDown: Invalid input/),
    ]);
  });

  it('refuses text that is not YAML, or a key given twice', () => {
    expect(problemsOf('window: [30d')[0]).toMatch(/^not valid YAML/);
    expect(problemsOf(`${SHIPPED}\nwindow: 28d\n`)[0]).toMatch(/^not valid YAML: .*unique/i);
  });
});
