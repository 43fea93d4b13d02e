"""Several nodes: the recipe keeps one-node runs as they were, the training job asks SLURM for one task per GPU on
every node in the executor plugin's terms, and a training task checks what SLURM started before it builds anything."""

from __future__ import annotations

import copy
import json

import pytest

from rfdetr_coco_pipeline.config_check import config_errors, load_schema
from rfdetr_coco_pipeline.data.stage import this_nodes_report
from rfdetr_coco_pipeline.needs import training_launch_resources
from rfdetr_coco_pipeline.settings import Settings
from rfdetr_coco_pipeline.training.ranks import check_srun_tasks
from rfdetr_coco_pipeline.training.recipe import recipe_id, run_recipe
from tests.helpers.workflow import REPO, base_config, settings_of

SCHEMA = load_schema(REPO / "schemas" / "config.schema.yaml")


def test_a_config_without_nodes_is_valid_and_trains_the_recipe_it_trained_before():
    """A config written before `nodes` and `launch` existed: valid, one node, and the same training parameter and
    run id as `nodes: 1`, so a run started then resumes."""
    old = copy.deepcopy(base_config())
    del old["train"]["nodes"], old["train"]["launch"]
    assert config_errors(old, SCHEMA) == []
    before, now = Settings.from_config(old), settings_of()
    assert before.recipe.nodes == 1 and before.train.launch == "auto" and not before.srun_launch
    assert before.recipe.as_parameter() == now.recipe.as_parameter()
    assert "nodes" not in json.loads(now.recipe.as_parameter())
    profile = now.gpu_profiles[0]
    assert recipe_id(run_recipe(before.recipe, profile, "1.11.2")) == recipe_id(
        run_recipe(now.recipe, profile, "1.11.2")
    )


def test_nodes_are_part_of_the_recipe_and_the_learning_rate_follows_every_gpu():
    one, two = settings_of(gpus=2), settings_of(gpus=2, nodes=2)
    profile = one.gpu_profiles[0]
    recipe_one, recipe_two = run_recipe(one.recipe, profile, "1.11.2"), run_recipe(two.recipe, profile, "1.11.2")
    assert recipe_id(recipe_one) != recipe_id(recipe_two) and recipe_two["nodes"] == 2
    assert recipe_two["lr"] == pytest.approx(2 * recipe_one["lr"])  # 4 GPUs against 2, lr_scaling: linear
    assert (
        run_recipe(settings_of(gpus=2, nodes=2, lr_scaling="none").recipe, profile, "1.11.2")["lr"]
        == (base_config()["train"]["lr"])
    )


def test_several_nodes_cannot_be_started_by_lightning():
    config = copy.deepcopy(base_config())
    config["train"].update(nodes=2, launch="lightning")
    (error,) = config_errors(config, SCHEMA)
    assert error.startswith("train.launch: lightning starts the processes of one node only, and train.nodes is 2")
    assert "set train.launch: srun (or auto)" in error


def test_the_launch_follows_the_setting_and_a_single_process_needs_none():
    assert settings_of(nodes=2).srun_launch  # auto with several nodes
    assert not settings_of(gpus=2).srun_launch  # auto on one node: Lightning's
    assert settings_of(gpus=2, launch="srun").srun_launch
    assert not settings_of(launch="srun").srun_launch  # one GPU on one node: one process, nothing to launch


def cpus_per_task(resources: dict, threads: int) -> int:
    return resources["cpus_per_task"](None, threads)


def test_the_training_job_asks_slurm_for_a_task_per_gpu_on_every_node_in_the_plugins_terms():
    # Lightning's launch: the job's GPU count, as before
    assert training_launch_resources(settings_of(gpus=2)) == {"gpu": 2}
    # srun, 4 GPUs on each of 2 nodes: gres counts per node (the plugin's --gpus would count the whole job)
    resources = training_launch_resources(settings_of(gpus=4, nodes=2))
    assert {k: v for k, v in resources.items() if k != "cpus_per_task"} == {
        "nodes": 2,
        "mpi": "srun",
        "gres": "gpu:4",
        "tasks_per_node": 4,
    }
    assert cpus_per_task(resources, 64) == 16  # the job's cores per node, shared among its 4 tasks
    # one GPU a node: the plugin takes more than one task a node only as `tasks`
    resources = training_launch_resources(settings_of(gpus=1, nodes=3))
    assert resources["tasks"] == 3 and resources["tasks_per_gpu"] == 1 and "tasks_per_node" not in resources
    # a CPU run through srun asks for no GPU
    assert "gres" not in training_launch_resources(settings_of(gpus=2, launch="srun", device="cpu"))


def test_a_training_task_checks_what_srun_started_and_names_both_sides(monkeypatch):
    for name in ("SLURM_STEP_ID", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_NTASKS_PER_NODE", "SLURM_NNODES"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(Exception, match=r"was not started by srun\. Run the workflow with the SLURM profile"):
        check_srun_tasks(2, 2)
    for name, value in {"SLURM_STEP_ID": "0", "SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_NNODES": "2"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SLURM_JOB_NAME", "train_block")  # not an interactive job, where Lightning checks nothing
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "2")
    check_srun_tasks(2, 2)  # as asked
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "1")
    monkeypatch.setenv("SLURM_NNODES", "4")
    with pytest.raises(Exception) as error:
        check_srun_tasks(2, 2)
    assert "--ntasks-per-node=1" in str(error.value)  # what SLURM started
    assert "2 task(s) on each of 2 node(s) (train.gpus: 2, train.nodes: 2)" in str(error.value)  # what was asked
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "2")
    with pytest.raises(Exception, match=r"--nodes=4"):  # the node count alone off
        check_srun_tasks(2, 2)


def test_each_node_keeps_its_own_staging_report(monkeypatch, tmp_path):
    report = tmp_path / "block_01" / "stage.json"
    monkeypatch.delenv("SLURM_NODEID", raising=False)
    assert this_nodes_report(report) == report
    monkeypatch.setenv("SLURM_NODEID", "0")
    assert this_nodes_report(report) == report  # the first node's is the rule's output
    monkeypatch.setenv("SLURM_NODEID", "1")
    assert this_nodes_report(report) == tmp_path / "block_01" / "stage.node1.json"
