import * as dashboard from '@grafana/grafana-foundation-sdk/dashboard';
import { batcherBoard } from './boards/batcher.board';
import { cacheBoard } from './boards/cache.board';
import { meshBoard } from './boards/mesh.board';
import { requestPathBoard } from './boards/request-path.board';
import { rolloutsBoard } from './boards/rollouts.board';
import { sloBoard } from './boards/slo.board';
import { workerBoard } from './boards/worker.board';

/** Every board, in the order the generator writes them. */
export function dashboards(): dashboard.Dashboard[] {
  return [sloBoard(), requestPathBoard(), batcherBoard(), workerBoard(), rolloutsBoard(), cacheBoard(), meshBoard()];
}

/** The file a board is written to, under grafana/dashboards/. */
export function fileNameOf(board: dashboard.Dashboard): string {
  if (board.uid === undefined || !/^[a-z0-9-]{1,40}$/.test(board.uid))
    throw new Error(`board "${board.title}" needs a uid of 1 to 40 lower-case letters, digits and dashes`);
  return `${board.uid}.json`;
}

/** A board as the JSON file Grafana provisions: two-space indents, a final newline. */
export function render(board: dashboard.Dashboard): string {
  return `${JSON.stringify(board, null, 2)}\n`;
}

/** Every board's file: name (`<uid>.json`) and text. */
export function renderAll(): { fileName: string; text: string }[] {
  return dashboards().map((board) => ({ fileName: fileNameOf(board), text: render(board) }));
}

export interface PanelQuery {
  /** The board's uid (its file is grafana/dashboards/<uid>.json). */
  board: string;
  /** The panel's title. */
  panel: string;
  /** The PromQL, as the board holds it: with Grafana variables ($model, $__rate_interval, …) unless resolved. */
  expr: string;
}

/** The Grafana built-in variables the boards use, as resolveVariables fills them in. */
export const BUILT_IN_VARIABLES: Readonly<Record<string, string>> = {
  __rate_interval: '5m',
  __range: '1h',
  __interval: '1m',
};

/**
 * The value each variable of a board takes when nobody picked one: `.*` (all) for a label
 * variable, the initial choice for the others; built-ins per BUILT_IN_VARIABLES.
 */
export function variableDefaults(board: dashboard.Dashboard): Record<string, string> {
  const values: Record<string, string> = { ...BUILT_IN_VARIABLES };
  for (const variable of board.templating.list ?? []) {
    const current = variable.current?.value;
    if (variable.includeAll === true && variable.allValue !== undefined) values[variable.name] = variable.allValue;
    else if (typeof current === 'string') values[variable.name] = current;
    else throw new Error(`board ${board.uid}: variable ${variable.name} has no default to resolve`);
  }
  return values;
}

/** Replaces `$name` and `${name}` with the values given; throws on a variable it has no value for. */
export function resolveVariables(expr: string, values: Readonly<Record<string, string>>): string {
  return expr.replace(/\$\{(\w+)\}|\$(\w+)/g, (whole, braced: string | undefined, bare: string | undefined) => {
    const name = (braced ?? bare)!;
    const value = values[name];
    if (value === undefined) throw new Error(`no value for the variable ${whole} in: ${expr}`);
    return value;
  });
}

function queriesOf(panel: dashboard.Panel | dashboard.RowPanel): { title: string; exprs: string[] }[] {
  if (panel.type === 'row') return ((panel as dashboard.RowPanel).panels ?? []).flatMap(queriesOf);
  const targets = ((panel as dashboard.Panel).targets ?? []) as { expr?: unknown }[];
  return [
    {
      title: panel.title ?? '',
      exprs: targets.map((target) => target.expr).filter((expr): expr is string => typeof expr === 'string'),
    },
  ];
}

/**
 * Every panel query of every board, one entry per query (a panel with three queries gives three),
 * read back from the built boards, so it lists exactly what the JSON files hold. With
 * `{ resolve: true }` the Grafana variables are filled in with their defaults (all models and
 * instances, the default objectives, $__rate_interval = 5m, $__range = 1h), ready to send to Prometheus.
 */
export function panelQueries(options: { resolve?: boolean } = {}): PanelQuery[] {
  return dashboards().flatMap((board) => {
    const defaults = variableDefaults(board);
    return (board.panels ?? []).flatMap(queriesOf).flatMap(({ title, exprs }) =>
      exprs.map((expr) => ({
        board: board.uid!,
        panel: title,
        expr: options.resolve === true ? resolveVariables(expr, defaults) : expr,
      })),
    );
  });
}

/** Every query variable's query (label_values(…)) of every board. */
export function variableQueries(): { board: string; variable: string; query: string }[] {
  return dashboards().flatMap((board) =>
    (board.templating.list ?? [])
      .filter((variable) => variable.type === dashboard.VariableType.Query)
      .map((variable) => ({
        board: board.uid!,
        variable: variable.name,
        query: typeof variable.query === 'string' ? variable.query : JSON.stringify(variable.query),
      })),
  );
}
