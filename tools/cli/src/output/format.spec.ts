import { clone, create } from '@bufbuild/protobuf';
import { DataType } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { ModelSchema, RolloutPolicySchema, VersionState } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { formatBytes, formatModelDetails, formatModelList, formatRollout, formatVersionPolicy, table } from './format';

const version = (model: string, id: number, state: VersionState, extra: object = {}) => ({
  name: `models/${model}/versions/${id}`,
  state,
  ...extra,
});

const classifier = create(ModelSchema, {
  name: 'models/classifier',
  platform: 'onnxruntime_onnx',
  pinned: true,
  labels: { team: 'vision', task: 'cls' },
  versionPolicy: { policy: { case: 'latest', value: 2 } },
  versions: [
    version('classifier', 1, VersionState.RETIRED),
    version('classifier', 2, VersionState.READY, {
      signature: {
        inputs: [{ name: 'image', datatype: DataType.FP32, shape: [-1n, 224n, 224n, 3n] }],
        outputs: [{ name: 'scores', datatype: DataType.FP16, shape: [-1n, 10n] }],
        maxBatchSize: 8,
      },
      batching: {
        maxBatchSize: 4,
        maxQueueDelayUs: 500n,
        preferredBatchSizes: [2, 4],
        priorityLevels: 2,
        maxQueueSize: 64,
      },
      processing: {
        inputNormalizations: [{ input: 'image', mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225] }],
        outputLabels: [{ output: 'scores', labels: ['cat', 'dog'] }],
      },
      artifact: { sha256: 'ab'.repeat(32), sizeBytes: 3n * 1024n * 1024n, format: 'onnx' },
      createTime: { seconds: 1_700_000_000n, nanos: 0 },
    }),
    version('classifier', 3, VersionState.FAILED, { stateReason: 'input "image" has an unsupported type' }),
  ],
  rollout: {
    stableVersion: '2',
    canary: { version: '3', percent: 10 },
    variants: [{ version: '4', percent: 20 }],
    shadow: { version: '2', percent: 5 },
    fallbackModel: 'tiny',
  },
  cache: { enabled: true, ttlMs: 60_000n, maxEntryBytes: 1024n },
});

const tiny = create(ModelSchema, {
  name: 'models/tiny',
  unloaded: true,
  versions: [version('tiny', 1, VersionState.REGISTERED), version('tiny', 2, VersionState.LOADING)],
});

describe('output format', () => {
  it('lists models by name with their versions and states, the versions serving, pinned and unloaded', () => {
    expect(formatModelList([tiny, classifier])).toBe(
      [
        'NAME        VERSIONS                      SERVING  PINNED  UNLOADED',
        'classifier  2 READY, 3 FAILED, 1 retired  2        yes     no',
        'tiny        1 REGISTERED, 2 LOADING       -        no      yes',
        '',
      ].join('\n'),
    );
    expect(formatModelList([])).toBe('No models registered.\n');
  });

  it("shows a model's settings, its versions' states, and each live version's signature, batching and processing", () => {
    const text = formatModelDetails(classifier);

    expect(text).toContain(
      [
        'Model:           classifier',
        'Platform:        onnxruntime_onnx',
        'Pinned:          yes',
        'Unloaded:        no',
        'Version policy:  latest 2',
        'Serving:         2',
        'Cache:           on, ttl 60000 ms, entries up to 1.0 KiB',
        'Labels:          task=cls, team=vision',
      ].join('\n'),
    );
    expect(text).toContain(
      [
        'VERSION  STATE    CREATED                   REASON',
        '1        RETIRED  -',
        '2        READY    2023-11-14T22:13:20.000Z',
        '3        FAILED   -                         input "image" has an unsupported type',
      ].join('\n'),
    );
    expect(text).toContain(
      [
        'Version 2: READY',
        '  Inputs:',
        '    NAME   DATATYPE  SHAPE',
        '    image  FP32      [-1,224,224,3]',
        '  Outputs:',
        '    NAME    DATATYPE  SHAPE',
        '    scores  FP16      [-1,10]',
        '  Max batch size: 8',
        '  Batching: max batch 4, max queue delay 500 us, preferred sizes 2, 4, 2 priority levels (default the lowest), queue up to 64 requests',
        '  Warm-up: synthetic (no samples given); warmed up',
        "  Operator threads: the worker's default",
        '  Processing:',
        '    input image: (x - mean) / std, mean [0.485, 0.456, 0.406], std [0.229, 0.224, 0.225]',
        '    output scores: 2 class labels',
        `  Artifact: sha256 ${'ab'.repeat(32)}, 3.0 MiB`,
      ].join('\n'),
    );
    expect(text).toContain('Version 3: FAILED (input "image" has an unsupported type)\n  Batching: defaults');
    expect(text).toContain(
      "  Warm-up: synthetic (no samples given)\n  Operator threads: the worker's default\n  Processing: none",
    );
    expect(text).not.toContain('Version 1:');
  });

  it('shows the warm-up samples a version was given, and a READY version that serves without warm-up, saying why', () => {
    const vad = create(ModelSchema, {
      name: 'models/vad',
      versions: [
        {
          ...version('vad', 1, VersionState.READY),
          warmUpError: 'synthetic warm-up at batch 1 failed on cpu: Pad reflect requires axis length >= 2',
        },
        { ...version('vad', 2, VersionState.READY), warmUp: { samples: [{ name: '16 kHz' }, {}] } },
        { ...version('vad', 3, VersionState.LOADING), warmUp: { samples: [{}] } },
      ],
    });
    const text = formatModelDetails(vad);
    expect(text).toMatch(/\n1 +READY +- +not warmed up \(see Warm-up\)\n2 +READY +-\n/);
    expect(text).toContain(
      'Version 1: READY\n  Batching: defaults (up to the max batch size, no waiting while a worker is idle)\n  Warm-up: synthetic (no samples given); NOT warmed up: synthetic warm-up at batch 1 failed on cpu: Pad reflect requires axis length >= 2\n',
    );
    expect(text).toContain(
      'Version 2: READY\n  Batching: defaults (up to the max batch size, no waiting while a worker is idle)\n  Warm-up: 2 samples given ("16 kHz", sample 2); warmed up\n',
    );
    expect(text).toContain(
      'Version 3: LOADING\n  Batching: defaults (up to the max batch size, no waiting while a worker is idle)\n  Warm-up: 1 sample given (sample 1)\n',
    );
  });

  it('shows the stable version, canary, variants, shadow and fallback of a rollout, with the state of each version', () => {
    expect(formatRollout(classifier)).toBe(
      [
        'Rollout of classifier:',
        '  stable    2 (READY)',
        '  canary    3: 10% of requests (FAILED)',
        '  variants  4: 20% of routing keys (not found)',
        '  shadow    2: mirrors 5% of requests (READY)',
        '  fallback  model tiny',
        '',
      ].join('\n'),
    );
  });

  it('says where requests go when there is no rollout, or no stable version is set', () => {
    expect(formatRollout(tiny)).toBe(
      'Rollout of tiny: none; requests that name no version go to the latest READY version (none READY yet).\n',
    );
    const canaryOnly = clone(ModelSchema, classifier);
    canaryOnly.rollout = create(RolloutPolicySchema, { canary: { version: '3', percent: 12.5 } });
    expect(formatRollout(canaryOnly)).toContain(
      '  stable  the latest READY version (now 2)\n  canary  3: 12.5% of requests (FAILED)\n',
    );
  });

  it('names the version policies', () => {
    expect(formatVersionPolicy(undefined)).toBe('latest 1 (default)');
    expect(
      formatVersionPolicy(
        create(ModelSchema, { versionPolicy: { policy: { case: 'specific', value: { versions: ['1', '3'] } } } })
          .versionPolicy,
      ),
    ).toBe('specific 1, 3');
    expect(
      formatVersionPolicy(create(ModelSchema, { versionPolicy: { policy: { case: 'all', value: {} } } }).versionPolicy),
    ).toBe('all');
  });

  it('sizes bytes and aligns tables', () => {
    expect([formatBytes(512), formatBytes(1536), formatBytes(5 * 1024 ** 3)]).toEqual(['512 B', '1.5 KiB', '5.0 GiB']);
    expect(
      table(
        ['A', 'LONG'],
        [
          ['wide cell', 'x'],
          ['y', ''],
        ],
      ),
    ).toBe('A          LONG\nwide cell  x\ny\n');
  });
});
