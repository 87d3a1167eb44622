/**
 * Clamor for Jupyter's JupyterLab extension: a "Clamor" panel in the left sidebar
 * listing the running kernels' clusters (extension/ serves the data), and the
 * command `clamor:open-view`, which opens a cluster's live view as a main-area tab.
 */

import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette, WidgetTracker } from '@jupyterlab/apputils';
import { LabIcon } from '@jupyterlab/ui-components';

import { VIEWS } from './api';
import { ClamorPanel } from './panel';
import { ClamorView } from './view';

const PLUGIN_ID = 'clamor-jupyter-labextension:plugin';
const PANEL_ID = 'clamor-sidebar';

export namespace CommandIDs {
  export const openView = 'clamor:open-view';
  export const showPanel = 'clamor:show-panel';
}

/** Three workers around a driver. */
export const clamorIcon = new LabIcon({
  name: 'clamor:cluster',
  svgstr: `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <circle cx="12" cy="12" r="3.2"/>
    <circle cx="4.5" cy="5" r="2.4"/><circle cx="19.5" cy="5" r="2.4"/><circle cx="12" cy="21" r="2.4"/>
    <path d="M5.4 5.9l5.2 4.9-.9 1-5.2-4.9zM18.6 5.9l-5.2 4.9.9 1 5.2-4.9zM11.3 14h1.4v5h-1.4z"/>
  </g>
</svg>`
});

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'A sidebar of the running Clamor clusters, with their live views as tabs.',
  autoStart: true,
  optional: [ILayoutRestorer, ICommandPalette],
  activate: (
    app: JupyterFrontEnd,
    restorer: ILayoutRestorer | null,
    palette: ICommandPalette | null
  ) => {
    const tracker = new WidgetTracker<ClamorView>({ namespace: 'clamor-view' });

    app.commands.addCommand(CommandIDs.openView, {
      label: args => {
        const view = VIEWS.find(v => v.name === args['view']);
        return view ? `Open Clamor ${view.label}` : 'Open a Clamor view';
      },
      execute: args => {
        const kernelId = String(args['kernelId'] ?? '');
        const view = String(args['view'] ?? 'dashboard');
        const name = String(args['name'] ?? `kernel ${kernelId.slice(0, 8)}`);
        if (!kernelId) {
          return;
        }
        const id = ClamorView.widgetId(kernelId, view);
        let widget = tracker.find(w => w.id === id);
        if (!widget) {
          widget = new ClamorView(kernelId, view, name, clamorIcon);
          void tracker.add(widget);
          app.shell.add(widget, 'main');
        }
        app.shell.activateById(widget.id);
        return widget;
      }
    });

    const panel = new ClamorPanel({
      settings: app.serviceManager.serverSettings,
      sessions: app.serviceManager.sessions,
      openView: (kernelId, view, name) =>
        void app.commands.execute(CommandIDs.openView, { kernelId, view, name })
    });
    panel.id = PANEL_ID;
    panel.title.icon = clamorIcon;
    panel.title.caption = 'Clamor clusters';
    app.shell.add(panel, 'left', { rank: 600 });

    app.commands.addCommand(CommandIDs.showPanel, {
      label: 'Show Clamor Clusters',
      execute: () => app.shell.activateById(PANEL_ID)
    });
    palette?.addItem({ command: CommandIDs.showPanel, category: 'Clamor' });

    if (restorer) {
      restorer.add(panel, PANEL_ID);
      void restorer.restore(tracker, {
        command: CommandIDs.openView,
        args: w => ({ kernelId: w.kernelId, view: w.view, name: w.name }),
        name: w => `${w.kernelId}:${w.view}`
      });
    }
  }
};

export default plugin;
