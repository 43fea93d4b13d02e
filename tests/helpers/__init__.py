"""What several test files share: the archive server, the tiny COCO set, the workflow runner, rfdetr fixtures."""
