import { ModelLabels, ServedModels, UNKNOWN_LABEL } from './model-labels';

describe(ModelLabels.name, () => {
  const registered: Record<string, string[]> = { mlp: ['1', '2'] };
  const sut = new ModelLabels({
    hasModel: (model) => model in registered,
    hasVersion: (model, version) => registered[model]?.includes(version) === true,
  });

  it('names known models and versions as they are', () => {
    expect(sut.of('mlp', '2')).toEqual({ model: 'mlp', version: '2' });
  });

  it('gives every unknown model or version one value, whatever its length', () => {
    expect(sut.of('m'.repeat(15_000), '1')).toEqual({ model: UNKNOWN_LABEL, version: UNKNOWN_LABEL });
    expect(sut.of('mlp', '9')).toEqual({ model: 'mlp', version: UNKNOWN_LABEL });
    expect(sut.model('typo')).toBe(UNKNOWN_LABEL);
  });

  it('keeps an empty version (none asked for or resolved) empty', () => {
    expect(sut.version('mlp', '')).toBe('');
    expect(sut.version('typo', '')).toBe('');
  });
});

describe(ServedModels.name, () => {
  it('knows the model versions it was told were served, and nothing else', () => {
    const sut = new ServedModels();
    sut.remember('mlp', '1');
    expect([sut.hasModel('mlp'), sut.hasVersion('mlp', '1'), sut.hasVersion('mlp', '2'), sut.hasModel('tiny')]).toEqual(
      [true, true, false, false],
    );
  });

  it('forgets the least recently served model beyond its capacity', () => {
    const sut = new ServedModels(3);
    sut.remember('a', '1');
    sut.remember('b', '1');
    sut.remember('a', '2');
    sut.remember('c', '1'); // 4 versions: b, the least recently served, goes
    expect(['a', 'b', 'c'].map((m) => sut.hasModel(m))).toEqual([true, false, true]);
    expect(sut.hasVersion('a', '2')).toBe(true);
  });

  it('forgets everything when cleared', () => {
    const sut = new ServedModels();
    sut.remember('a', '1');
    sut.clear();
    expect(sut.hasModel('a')).toBe(false);
  });
});
