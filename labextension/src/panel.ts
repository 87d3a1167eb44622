/**
 * The Clamor sidebar: the clusters of the server's running kernels, polled from the
 * server extension's REST API, each with its workers (memory against budget, tasks),
 * the stage in progress, the pages served, and a button per live view.
 *
 * A cluster keeps its DOM node from one poll to the next (only its text changes), so
 * a click on a button is never lost to a redraw.
 */

import { ServerConnection, Session } from '@jupyterlab/services';
import { Poll } from '@lumino/polling';
import { Widget } from '@lumino/widgets';

import { ApiError, ICluster, IWorker, VIEWS, clamorUrl, fetchClusters } from './api';

/** Milliseconds between polls while the panel is shown. */
export const POLL_MS = 1500;

/** What the panel needs from the application. */
export interface IPanelOptions {
  settings: ServerConnection.ISettings;
  sessions: Session.IManager;
  /** Opens `view` of `kernelId`'s cluster in a main-area tab; `title` names its notebook. */
  openView: (kernelId: string, view: string, title: string) => void;
}

export class ClamorPanel extends Widget {
  constructor(private readonly options: IPanelOptions) {
    super();
    this.addClass('clamor-Panel');
    const header = el('div', 'clamor-Panel-header');
    header.append(el('span', 'clamor-Panel-title', 'Clamor clusters'));
    const index = el('a', 'clamor-Panel-index', 'index ↗') as HTMLAnchorElement;
    index.href = clamorUrl('');
    index.target = '_blank';
    index.rel = 'noopener';
    index.title = 'The server extension\u2019s list of clusters, in a browser tab';
    header.append(index);
    this._state = el('div', 'clamor-Panel-state', 'loading…');
    this._list = el('div', 'clamor-Panel-list');
    this._empty = el(
      'div',
      'clamor-Panel-empty',
      'No running kernel has a Clamor cluster. Start one in a notebook on the ' +
        'Clamor kernel: %clamor start -n 2, or use cluster.'
    );
    this.node.append(header, this._state, this._empty, this._list);
    this._poll = new Poll({
      factory: () => this.refresh(),
      frequency: { interval: POLL_MS, backoff: true, max: 15 * POLL_MS },
      name: 'clamor:clusters',
      standby: () => (this.isVisible ? 'when-hidden' : true)
    });
  }

  /** How many polls have drawn an answer (for tests and debugging). */
  get updates(): number {
    return this._updates;
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._poll.dispose();
    super.dispose();
  }

  protected onAfterShow(): void {
    void this._poll.refresh();
  }

  /** Fetch the clusters and draw them (a failure shows, and the poll backs off). */
  async refresh(): Promise<void> {
    let clusters: ICluster[];
    try {
      clusters = await fetchClusters(this.options.settings);
    } catch (err) {
      this._state.textContent =
        err instanceof ApiError && err.status === 404
          ? 'This Jupyter server has no Clamor server extension (clamor.extension): ' +
            'check `jupyter server extension list`.'
          : `The Clamor server extension does not answer: ${(err as Error).message || err}`;
      this._state.classList.add('clamor-mod-error');
      this._empty.style.display = 'none'; // unknown, not none
      throw err;
    }
    const notebooks = new Map<string, string>();
    for (const session of this.options.sessions.running()) {
      if (session.kernel) {
        notebooks.set(session.kernel.id, session.path);
      }
    }
    this._draw(clusters, notebooks);
  }

  private _draw(clusters: ICluster[], notebooks: Map<string, string>): void {
    const seen = new Set<string>();
    for (const cluster of clusters) {
      const id = cluster.row.kernel_id;
      seen.add(id);
      let card = this._cards.get(id);
      if (!card) {
        card = new ClusterCard(id, (view, title) => this.options.openView(id, view, title));
        this._cards.set(id, card);
      }
      card.update(cluster, notebooks.get(id) ?? null);
      this._list.append(card.node); // in the server's order (by kernel id)
    }
    for (const [id, card] of this._cards) {
      if (!seen.has(id)) {
        card.node.remove();
        this._cards.delete(id);
      }
    }
    this._empty.style.display = clusters.length ? 'none' : '';
    this._state.classList.remove('clamor-mod-error');
    this._state.textContent =
      `${clusters.length} cluster${clusters.length === 1 ? '' : 's'} · ` +
      `updated ${new Date().toLocaleTimeString()}`;
    this._updates += 1;
    this.node.dataset.updates = String(this._updates);
  }

  private _poll: Poll;
  private _state: HTMLElement;
  private _list: HTMLElement;
  private _empty: HTMLElement;
  private _cards = new Map<string, ClusterCard>();
  private _updates = 0;
}

/** One cluster: its heading, stage, pages served, workers and view buttons. */
class ClusterCard {
  readonly node: HTMLElement;

  constructor(
    readonly kernelId: string,
    open: (view: string, title: string) => void
  ) {
    this.node = el('div', 'clamor-Cluster');
    this.node.dataset.kernelId = kernelId;
    this._title = el('div', 'clamor-Cluster-title');
    this._kernel = el('div', 'clamor-Cluster-kernel');
    this._stage = el('div', 'clamor-Cluster-stage');
    this._progress = el('div', 'clamor-Bar clamor-Cluster-progress');
    this._progressFill = el('div', 'clamor-Bar-fill');
    this._progress.append(this._progressFill);
    this._served = el('div', 'clamor-Cluster-served');
    this._workers = el('div', 'clamor-Cluster-workers');
    this._error = el('div', 'clamor-Cluster-error');
    const buttons = el('div', 'clamor-Cluster-views');
    for (const { name, label } of VIEWS) {
      const button = el('button', 'jp-Button clamor-ViewButton', label) as HTMLButtonElement;
      button.type = 'button';
      button.dataset.view = name;
      button.title = `Open the live ${label.toLowerCase()} of this cluster in a tab`;
      button.addEventListener('click', () => open(name, this._name));
      buttons.append(button);
    }
    this.node.append(
      this._title,
      this._kernel,
      this._stage,
      this._progress,
      this._served,
      this._workers,
      this._error,
      buttons
    );
  }

  update(cluster: ICluster, notebook: string | null): void {
    const { row, summary, workers, error } = cluster;
    this._name = notebook ? basename(notebook) : `kernel ${row.kernel_id.slice(0, 8)}`;
    this._title.textContent = this._name;
    this._title.title = notebook ?? row.kernel_id;
    this._kernel.textContent =
      `${row.kernel_name ?? 'kernel'} · ${row.execution_state ?? 'unknown'} · ` +
      `scheduler ${row.address}`;
    this._error.textContent = error ? `Not answering: ${error}` : '';
    this._error.style.display = error ? '' : 'none';
    if (!summary) {
      this._stage.textContent = `${row.workers} workers`;
      this._progress.style.display = 'none';
      this._served.textContent = '';
      this._workers.replaceChildren();
      return;
    }
    const stages = Object.entries(summary.active_stages);
    const lost = summary.workers_lost ? ` (${summary.workers_lost} lost)` : '';
    if (stages.length) {
      const parts = stages.map(
        ([id, s]) =>
          `stage ${id}: ${s.done}/${s.total} tasks done, ${s.running} on workers, ` +
          `${s.pending} waiting` +
          (s.speculative ? `, ${s.speculative} speculative` : '')
      );
      const total = stages.reduce((n, [, s]) => n + s.total, 0);
      const done = stages.reduce((n, [, s]) => n + s.done, 0);
      this._stage.textContent = `${plural(summary.workers, 'worker')}${lost} · ${parts.join('; ')}`;
      this._progress.style.display = '';
      this._progressFill.style.width = `${total ? (100 * done) / total : 0}%`;
      this.node.classList.add('clamor-mod-running');
    } else {
      this._stage.textContent =
        `${plural(summary.workers, 'worker')}${lost} · idle · ` +
        `${plural(summary.stages_run, 'stage')}, ${plural(summary.tasks_run, 'task')} run`;
      this._progress.style.display = 'none';
      this.node.classList.remove('clamor-mod-running');
    }
    this._served.textContent =
      `pages served: ${bytes(summary.bytes_served_by_driver)} by the driver, ` +
      `${bytes(summary.bytes_served_by_peers)} by peers, ${bytes(summary.bytes_mapped)} ` +
      `mapped in place · ${count(summary.pages_fetched)} pages fetched, ` +
      `${count(summary.pages_mapped)} mapped`;
    this._workers.replaceChildren(...workers.map(workerRow));
  }

  private _name = '';
  private _title: HTMLElement;
  private _kernel: HTMLElement;
  private _stage: HTMLElement;
  private _progress: HTMLElement;
  private _progressFill: HTMLElement;
  private _served: HTMLElement;
  private _workers: HTMLElement;
  private _error: HTMLElement;
}

/** A worker: its tasks, and its memory (pages cached + partitions kept) against its budget. */
function workerRow(w: IWorker): HTMLElement {
  const row = el('div', 'clamor-Worker');
  row.dataset.worker = String(w.id);
  row.classList.toggle('clamor-mod-lost', !w.alive);
  row.classList.toggle('clamor-mod-busy', w.alive && w.running > 0);
  const name = el('span', 'clamor-Worker-name', `worker ${w.id}`);
  const state = !w.alive
    ? 'lost'
    : `${plural(w.tasks_done, 'task')} done · ${queue(w.running)}${w.slow ? ' · slow' : ''}`;
  const tasks = el('span', 'clamor-Worker-tasks', state);
  const used = (w.cached_bytes || 0) + (w.partition_bytes || 0);
  const budget = w.memory_budget || 0;
  const bar = el('div', 'clamor-Bar clamor-Worker-memory');
  const fill = el('div', 'clamor-Bar-fill');
  fill.style.width = `${budget ? Math.min(100, (100 * used) / budget) : 0}%`;
  bar.append(fill);
  bar.title =
    `pages cached ${bytes(w.cached_bytes)}, partitions ${bytes(w.partition_bytes)} in memory` +
    (w.disk_bytes ? `, ${bytes(w.disk_bytes)} on disk` : '') +
    ` of a ${bytes(budget)} budget`;
  const memory = el(
    'span',
    'clamor-Worker-bytes',
    `memory ${bytes(used)} / ${bytes(budget)}` +
      (w.rss_bytes !== undefined ? ` · RSS ${bytes(w.rss_bytes)}` : '')
  );
  row.append(name, tasks, bar, memory);
  return row;
}

/** `1 task`, `2 tasks`. */
function plural(n: number, word: string): string {
  return `${n} ${word}${n === 1 ? '' : 's'}`;
}

/** A worker's attempts: it runs one at a time, the others wait in its queue. */
function queue(attempts: number): string {
  return attempts ? `1 running, ${attempts - 1} queued` : 'idle';
}

function el(tag: string, className: string, text?: string): HTMLElement {
  const node = document.createElement(tag);
  node.className = className;
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

function basename(path: string): string {
  return path.split('/').pop() || path;
}

/** Bytes in binary units, e.g. "1.5 GiB". */
export function bytes(n: number | undefined): string {
  let value = n || 0;
  for (const unit of ['B', 'KiB', 'MiB', 'GiB', 'TiB']) {
    if (Math.abs(value) < 1024 || unit === 'TiB') {
      return unit === 'B' ? `${value} B` : `${value.toFixed(1)} ${unit}`;
    }
    value /= 1024;
  }
  return `${value} B`;
}

function count(n: number | undefined): string {
  return (n || 0).toLocaleString('en-US');
}
