import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { parse } from 'yaml';
import * as dashboard from '@grafana/grafana-foundation-sdk/dashboard';
import type * as prometheus from '@grafana/grafana-foundation-sdk/prometheus';
import { dashboards, fileNameOf, panelQueries, renderAll, resolveVariables, variableDefaults } from './dashboards';
import { ERROR_OUTCOMES } from './boards/slo.board';
import { DASHBOARDS_DIR, workspaceRoot } from './main';
import { DATASOURCE_UID } from './panels';

const ROOT = workspaceRoot();
const DIR = join(ROOT, DASHBOARDS_DIR);
const REGENERATE = 'regenerate with `npx nx run dashboards:generate`';

type AnyPanel = dashboard.Panel & {
  gridPos?: dashboard.GridPos;
  fieldConfig?: { defaults?: { unit?: string } };
  options?: { yAxis?: { unit?: string } };
};

/** A panel's queries: the SDK types them as any datasource's query, these are Prometheus queries. */
function targetsOf(panel: AnyPanel): prometheus.dataquery[] {
  return (panel.targets ?? []) as prometheus.dataquery[];
}

function panelsOf(board: dashboard.Dashboard): AnyPanel[] {
  return (board.panels ?? []).filter((p): p is AnyPanel => p.type !== 'row');
}

describe('grafana/dashboards', () => {
  it.each(renderAll().map((f) => [f.fileName, f] as const))(
    `%s is the board the code makes (${REGENERATE})`,
    (fileName, file) => {
      const path = join(DIR, fileName);
      expect(existsSync(path) ? readFileSync(path, 'utf8') : `(missing: ${REGENERATE})`).toBe(file.text);
    },
  );

  it(`holds no board file the code does not make (${REGENERATE}: it deletes them)`, () => {
    const made = renderAll().map((f) => f.fileName);
    expect(readdirSync(DIR).filter((name) => name.endsWith('.json') && !made.includes(name))).toEqual([]);
  });
});

describe('the boards', () => {
  const boards = dashboards();

  it('have distinct uids and titles, and the infermesh tag', () => {
    expect(new Set(boards.map(fileNameOf)).size).toBe(boards.length);
    expect(new Set(boards.map((b) => b.title)).size).toBe(boards.length);
    for (const board of boards) expect(board.tags).toContain('infermesh');
  });

  it('name no datasource input: every panel, query and query variable uses the provisioned datasource uid', () => {
    for (const { text } of renderAll()) {
      expect(text).not.toMatch(/DS_PROMETHEUS|\$\{DS_|__inputs/);
    }
    for (const board of boards) {
      for (const panel of panelsOf(board)) {
        expect({ panel: panel.title, uid: panel.datasource?.uid }).toEqual({ panel: panel.title, uid: DATASOURCE_UID });
        for (const target of targetsOf(panel))
          expect({ panel: panel.title, uid: target.datasource?.uid }).toEqual({
            panel: panel.title,
            uid: DATASOURCE_UID,
          });
      }
      for (const variable of board.templating.list ?? []) {
        if (variable.type === dashboard.VariableType.Query)
          expect({ variable: variable.name, uid: variable.datasource?.uid }).toEqual({
            variable: variable.name,
            uid: DATASOURCE_UID,
          });
      }
    }
  });

  it.each(boards.map((b) => [b.uid!, b] as const))(
    '%s: every panel has a title, a description, a unit and queries with distinct refIds',
    (_uid, board) => {
      const panels = panelsOf(board);
      expect(panels.length).toBeGreaterThan(0);
      for (const panel of panels) {
        const where = `${board.uid} / ${panel.title ?? '(untitled)'}`;
        expect({ where, title: (panel.title ?? '').trim() !== '' }).toEqual({ where, title: true });
        expect({ where, description: (panel.description ?? '').trim().length >= 20 }).toEqual({
          where,
          description: true,
        });
        expect({ where, unit: panel.fieldConfig?.defaults?.unit ?? '' }).toEqual({
          where,
          unit: expect.stringMatching(/.+/),
        });
        if (panel.type === 'heatmap')
          expect({ where, yAxisUnit: panel.options?.yAxis?.unit ?? '' }).toEqual({
            where,
            yAxisUnit: expect.stringMatching(/.+/),
          });
        const refIds = targetsOf(panel).map((t) => t.refId);
        expect(refIds.length).toBeGreaterThan(0);
        expect(new Set(refIds).size).toBe(refIds.length);
      }
    },
  );

  it.each(boards.map((b) => [b.uid!, b] as const))(
    '%s: panels sit on the 24-column grid with distinct ids',
    (_uid, board) => {
      const ids = (board.panels ?? []).map((p) => p.id);
      expect(new Set(ids).size).toBe(ids.length);
      for (const panel of board.panels ?? []) {
        const grid = panel.gridPos!;
        expect(grid.x + grid.w).toBeLessThanOrEqual(24);
      }
    },
  );

  it('use no variable a board does not define', () => {
    expect(() => panelQueries({ resolve: true })).not.toThrow();
    for (const { expr } of panelQueries({ resolve: true })) expect(expr).not.toContain('$');
  });

  it('offer the SLO objective as a variable, 99.5 % unless picked otherwise', () => {
    const slo = boards.find((b) => b.uid === 'infermesh-slo')!;
    expect(variableDefaults(slo)).toMatchObject({ slo: '99.5', latency_objective: '99', latency_threshold: '0.25' });
    expect(resolveVariables('1 - $slo / 100', variableDefaults(slo))).toBe('1 - 99.5 / 100');
  });

  it('lists every panel query once per query, by board uid and panel title', () => {
    const queries = panelQueries();
    const targets = boards.flatMap((b) => panelsOf(b).flatMap(targetsOf));
    expect(queries).toHaveLength(targets.length);
    expect(queries).toContainEqual({
      board: 'infermesh-batcher',
      panel: 'Worker ejections',
      expr: expect.stringContaining('infermesh_batcher_worker_ejections_total'),
    });
  });
});

// The SLO alerts (tools/slo, compiled from grafana/slo/slos.yaml) and the SLO board must call the same outcomes failures.
const SLOS = join(ROOT, 'grafana', 'slo', 'slos.yaml');
describe('grafana/slo/slos.yaml', () => {
  it('names the error outcomes the SLO board counts as failures (ERROR_OUTCOMES in boards/slo.board.ts)', () => {
    const slos = parse(readFileSync(SLOS, 'utf8')) as { sli?: { availability?: { errorOutcomes?: string[] } } };
    expect([...(slos.sli?.availability?.errorOutcomes ?? [])].sort()).toEqual([...ERROR_OUTCOMES].sort());
  });
});

describe('grafana/provisioning', () => {
  const provisioning = join(ROOT, 'grafana', 'provisioning');

  it('provisions the Prometheus datasource under the uid the boards use, its URL from PROMETHEUS_URL', () => {
    const file = parse(readFileSync(join(provisioning, 'datasources', 'prometheus.yaml'), 'utf8')) as {
      apiVersion: number;
      datasources: Record<string, unknown>[];
    };
    expect(file.apiVersion).toBe(1);
    expect(file.datasources).toEqual([
      expect.objectContaining({ uid: DATASOURCE_UID, type: 'prometheus', access: 'proxy', url: '${PROMETHEUS_URL}' }),
    ]);
  });

  it('provisions the boards from grafana/dashboards, beside the provisioning folder', () => {
    const file = parse(readFileSync(join(provisioning, 'dashboards', 'infermesh.yaml'), 'utf8')) as {
      apiVersion: number;
      providers: { type: string; options: { path: string } }[];
    };
    expect(file.apiVersion).toBe(1);
    expect(file.providers).toEqual([
      expect.objectContaining({
        type: 'file',
        options: expect.objectContaining({ path: '${GF_PATHS_PROVISIONING}/../dashboards' }),
      }),
    ]);
  });
});
